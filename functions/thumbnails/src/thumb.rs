//! The thumbnail of an image (pure: bytes in, bytes out): JPEG, PNG, GIF or WebP decoded within
//! limits (a decompression bomb is refused before its pixels are allocated), scaled so its
//! longest side is at most `MAX_SIDE` (never upscaled), turned upright as its EXIF orientation
//! says (a phone's photo is stored sideways), encoded as JPEG, or PNG when the image has
//! transparency.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

/// The thumbnail's longest side (SPEC §14).
pub const MAX_SIDE: u32 = 320;
/// The largest original decoded, per side (a 12-megapixel photo is 4000 × 3000).
pub const MAX_DIMENSION: u32 = 12_000;
/// What the decoder may allocate: a 40-megapixel RGBA image, well inside the function's memory.
pub const MAX_ALLOC: u64 = 160 * 1024 * 1024;
const JPEG_QUALITY: u8 = 80;

/// A thumbnail made.
#[derive(Debug)]
pub struct Thumbnail {
    /// The original's size.
    pub width: u32,
    pub height: u32,
    pub bytes: Vec<u8>,
    pub content_type: &'static str,
}

/// Why there is no thumbnail (none is recorded, and the upload is never retried).
#[derive(Debug, PartialEq, Eq)]
pub enum NoThumbnail {
    /// Not one of the image types thumbnailed.
    NotAnImage,
    /// Larger than the limits: a decompression bomb, or just too big.
    TooLarge(String),
    /// Claims to be an image but does not decode.
    Undecodable(String),
}

/// The decoder's limits.
pub fn limits() -> Limits {
    let mut l = Limits::default();
    l.max_image_width = Some(MAX_DIMENSION);
    l.max_image_height = Some(MAX_DIMENSION);
    l.max_alloc = Some(MAX_ALLOC);
    l
}

pub fn make(bytes: &[u8]) -> Result<Thumbnail, NoThumbnail> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| NoThumbnail::Undecodable(e.to_string()))?;
    let format = reader.format();
    if !matches!(
        format,
        Some(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Gif | ImageFormat::WebP)
    ) {
        return Err(NoThumbnail::NotAnImage);
    }
    reader.limits(limits());
    let refused = |e| match e {
        image::ImageError::Limits(l) => NoThumbnail::TooLarge(l.to_string()),
        other => NoThumbnail::Undecodable(other.to_string()),
    };
    let mut decoder = reader.into_decoder().map_err(refused)?;
    // An unreadable orientation is no reason to refuse the picture: shown as stored.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image = DynamicImage::from_decoder(decoder).map_err(refused)?;
    image.apply_orientation(orientation);
    // The size as it is shown (upright).
    let (width, height) = (image.width(), image.height());
    let small = if width.max(height) > MAX_SIDE {
        image.thumbnail(MAX_SIDE, MAX_SIDE)
    } else {
        image
    };
    let (bytes, content_type) = encode(small).map_err(NoThumbnail::Undecodable)?;
    Ok(Thumbnail {
        width,
        height,
        bytes,
        content_type,
    })
}

fn encode(image: DynamicImage) -> Result<(Vec<u8>, &'static str), String> {
    let mut out = Cursor::new(Vec::new());
    // A GIF decodes with an alpha channel whether or not a pixel is transparent.
    let transparent = image.color().has_alpha() && image.to_rgba8().pixels().any(|p| p[3] < 255);
    if transparent {
        image
            .write_to(&mut out, ImageFormat::Png)
            .map_err(|e| e.to_string())?;
        return Ok((out.into_inner(), "image/png"));
    }
    let rgb = DynamicImage::ImageRgb8(image.to_rgb8());
    let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY);
    rgb.write_with_encoder(encoder).map_err(|e| e.to_string())?;
    Ok((out.into_inner(), "image/jpeg"))
}

/// An image of `w` × `h` encoded as `format` (tests and the bench make their uploads with it).
pub fn sample(w: u32, h: u32, format: ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([(x % 256) as u8, (y % 256) as u8, ((x + y) % 256) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(img)
        .write_to(&mut out, format)
        .expect("encode a sample image");
    out.into_inner()
}

/// A PNG whose header claims `w` × `h` pixels but holds none (a decompression bomb's header).
pub fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut png = sample(1, 1, ImageFormat::Png);
    // IHDR's data starts at byte 16 (8 signature + 4 length + 4 type); its CRC follows it.
    png[16..20].copy_from_slice(&w.to_be_bytes());
    png[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    png
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(t: &Thumbnail) -> DynamicImage {
        image::load_from_memory(&t.bytes).unwrap()
    }

    #[test]
    fn a_large_image_is_scaled_to_320_on_its_longest_side() {
        for format in [ImageFormat::Jpeg, ImageFormat::Png] {
            let t = make(&sample(1000, 500, format)).unwrap();
            assert_eq!((t.width, t.height), (1000, 500));
            let img = decoded(&t);
            assert_eq!((img.width(), img.height()), (320, 160), "{format:?}");
            assert_eq!(t.content_type, "image/jpeg");
        }
    }

    #[test]
    fn a_small_image_is_not_upscaled() {
        let t = make(&sample(100, 40, ImageFormat::Png)).unwrap();
        let img = decoded(&t);
        assert_eq!((img.width(), img.height()), (100, 40));
    }

    #[test]
    fn transparency_stays_png() {
        let img = image::RgbaImage::from_pixel(400, 400, image::Rgba([1, 2, 3, 0]));
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgba8(img)
            .write_to(&mut out, ImageFormat::Png)
            .unwrap();
        let t = make(&out.into_inner()).unwrap();
        assert_eq!(t.content_type, "image/png");
    }

    /// `jpeg` with an EXIF segment saying `orientation` (1-8), as a phone writes it.
    fn with_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
        let mut tiff = b"II*\0\x08\0\0\0".to_vec();
        tiff.extend(1u16.to_le_bytes());
        tiff.extend(0x0112u16.to_le_bytes());
        tiff.extend(3u16.to_le_bytes());
        tiff.extend(1u32.to_le_bytes());
        tiff.extend(orientation.to_le_bytes());
        tiff.extend([0, 0]);
        tiff.extend(0u32.to_le_bytes());
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend(tiff);
        let mut out = vec![0xFF, 0xD8, 0xFF, 0xE1];
        out.extend(u16::try_from(app1.len() + 2).unwrap().to_be_bytes());
        out.extend(app1);
        out.extend(&jpeg[2..]);
        out
    }

    #[test]
    fn a_photo_stored_sideways_is_turned_upright() {
        let stored = sample(600, 300, ImageFormat::Jpeg);
        // 6: the camera was turned a quarter clockwise; shown 300 wide, 600 high.
        let t = make(&with_orientation(&stored, 6)).unwrap();
        assert_eq!((t.width, t.height), (300, 600));
        let img = decoded(&t);
        assert_eq!((img.width(), img.height()), (160, 320));
        let t = make(&with_orientation(&stored, 1)).unwrap();
        assert_eq!((t.width, t.height), (600, 300));
    }

    #[test]
    fn an_opaque_gif_gets_a_jpeg() {
        let t = make(&sample(400, 200, ImageFormat::Gif)).unwrap();
        assert_eq!(t.content_type, "image/jpeg");
    }

    #[test]
    fn non_images_corrupt_images_and_bombs_get_none() {
        assert_eq!(
            make(b"%PDF-1.4 not an image").unwrap_err(),
            NoThumbnail::NotAnImage
        );
        let corrupt = b"\x89PNG\r\n\x1a\n broken".to_vec();
        assert!(matches!(
            make(&corrupt).unwrap_err(),
            NoThumbnail::Undecodable(_)
        ));
        // 13000 × 13000 is within image's default allocation limit (512 MiB): ours refuse it.
        for (w, h) in [(100_000, 100_000), (13_000, 13_000)] {
            let bomb = png_claiming(w, h);
            let made = make(&bomb);
            assert!(matches!(made, Err(NoThumbnail::TooLarge(_))), "{made:?}");
        }
    }
}

/// The 5-second goal's decode-and-scale part, measured in the debug build the local stack runs
/// (docs/benchmarks.md): `cargo test -p thumbnails --lib -- --ignored --nocapture twelve`.
#[test]
#[ignore]
fn twelve_megapixel_jpeg_timing() {
    let jpeg = sample(4000, 3000, ImageFormat::Jpeg);
    let started = std::time::Instant::now();
    let t = make(&jpeg).unwrap();
    let took = started.elapsed();
    println!(
        "12 MP JPEG ({} bytes) → {} bytes in {took:?}",
        jpeg.len(),
        t.bytes.len()
    );
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}
