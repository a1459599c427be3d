//! Validated identifiers, parsed once at the edge (docs/api.md §3, §16): code past the edge holds a
//! `UserId` or `ConversationId`, never a string it would have to check again.

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

pub const MAX_USER_ID_CHARS: usize = 128;

/// A user id: 1–128 characters of `A-Za-z0-9._:@-|` (`|` because Auth0-style issuers write
/// `auth0|…`, `google-oauth2|…`). No key or id is built by joining user ids with a separator
/// (`hex_digest` length-prefixes its parts), so `|` cannot make two keys collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct UserId(String);

impl UserId {
    pub fn parse(s: &str) -> Option<UserId> {
        let ok = !s.is_empty()
            && s.len() <= MAX_USER_ID_CHARS
            && s.bytes().all(|b| {
                b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-' | b'|')
            });
        ok.then(|| UserId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A conversation id as this service hands them out: `d-` (direct) or `g-` (group) and 32
/// lower-case hex digits. Anything else cannot exist, so it is answered 404 without a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ConversationId(String);

impl ConversationId {
    pub fn parse(s: &str) -> Option<ConversationId> {
        let hex = |h: &str| {
            h.len() == 32
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        };
        s.strip_prefix("d-")
            .or_else(|| s.strip_prefix("g-"))
            .is_some_and(hex)
            .then(|| ConversationId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether it names a direct conversation (`d-…`).
    pub fn is_direct(&self) -> bool {
        self.0.starts_with("d-")
    }

    /// The one direct conversation of an unordered pair: derived from the pair, so two users
    /// opening it at the same instant write the same key and the database lets only one create it.
    pub fn direct(a: &UserId, b: &UserId) -> ConversationId {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        ConversationId(format!(
            "d-{}",
            hex_digest(&["direct", lo.as_str(), hi.as_str()])
        ))
    }

    /// A group created with a `clientRequestId` gets an id derived from (creator, request id), so
    /// a retry lands on the same key; without one it gets a random id.
    pub fn group(creator: &UserId, client_request_id: Option<&str>) -> ConversationId {
        ConversationId(match client_request_id {
            Some(r) => format!("g-{}", hex_digest(&["group", creator.as_str(), r])),
            None => format!("g-{}", uuid::Uuid::new_v4().simple()),
        })
    }
}

macro_rules! string_id {
    ($t:ty, $what:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// Stored ids are checked again when read back: a bad one is corrupt data, not a guess.
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                <$t>::parse(&s)
                    .ok_or_else(|| serde::de::Error::custom(concat!("not a valid ", $what)))
            }
        }
    };
}

string_id!(UserId, "user id");
string_id!(ConversationId, "conversation id");

/// 128 bits of SHA-256 over length-prefixed parts, in hex: ("ab","c") and ("a","bc") differ.
pub(crate) fn hex_digest(parts: &[&str]) -> String {
    digest(parts).iter().map(|b| format!("{b:02x}")).collect()
}

/// 128 bits of SHA-256 over length-prefixed parts.
pub(crate) fn digest(parts: &[&str]) -> [u8; 16] {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    let mut out = [0; 16];
    out.copy_from_slice(&h.finalize()[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn user_ids() {
        assert!(UserId::parse("alice.b_c:d@e-f9").is_some());
        assert!(UserId::parse(&"a".repeat(128)).is_some());
        assert!(UserId::parse(&"a".repeat(129)).is_none());
        assert!(UserId::parse("").is_none());
        assert!(UserId::parse("a b").is_none());
        assert!(UserId::parse("a/b").is_none());
        assert!(UserId::parse("é").is_none());
        assert!(UserId::parse("a%40b").is_none());
        // Auth0-style subjects.
        assert!(UserId::parse("auth0|5f7c8ec7c33c6c004bbafe82").is_some());
        assert!(UserId::parse("google-oauth2|123").is_some());
        assert!(UserId::parse("|").is_some());
        assert!(UserId::parse(&format!("auth0|{}", "a".repeat(122))).is_some());
        assert!(UserId::parse(&format!("auth0|{}", "a".repeat(123))).is_none());
        for bad in ["a\\b", "a,b", "a#b", "a/b|c", "a\tb", "a\u{7f}"] {
            assert!(UserId::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn direct_id_is_per_unordered_pair() {
        let direct = |a: &str, b: &str| ConversationId::direct(&u(a), &u(b));
        // (one pair, another, the same conversation)
        let cases = [
            (("a", "b"), ("b", "a"), true),
            (("a", "b"), ("a", "c"), false),
            // Concatenation ambiguity does not collide.
            (("ab", "c"), ("a", "bc"), false),
            // Nor with `|` in ids: ("a|b", "c") is not ("a", "b|c").
            (("a|b", "c"), ("a", "b|c"), false),
            (
                ("auth0|1", "google-oauth2|2"),
                ("google-oauth2|2", "auth0|1"),
                true,
            ),
        ];
        for ((a, b), (c, d), same) in cases {
            assert_eq!(
                direct(a, b) == direct(c, d),
                same,
                "({a}, {b}) and ({c}, {d})"
            );
        }
        let d = ConversationId::direct(&u("a"), &u("b"));
        assert_eq!(ConversationId::parse(d.as_str()), Some(d));
    }

    #[test]
    fn group_ids() {
        let r = "6f1c2a1e-98c1-4d6b-9a51-0e4b7c1d2e3f";
        assert_eq!(
            ConversationId::group(&u("a"), Some(r)),
            ConversationId::group(&u("a"), Some(r))
        );
        assert_ne!(
            ConversationId::group(&u("a"), Some(r)),
            ConversationId::group(&u("b"), Some(r))
        );
        assert_ne!(
            ConversationId::group(&u("a"), None),
            ConversationId::group(&u("a"), None)
        );
        let g = ConversationId::group(&u("a"), None);
        assert_eq!(ConversationId::parse(g.as_str()), Some(g));
    }

    #[test]
    fn only_ids_we_hand_out_parse() {
        for bad in [
            "g-xyz",
            "../etc",
            "",
            "x-00000000000000000000000000000000",
            "g-0000000000000000000000000000000A",
            "g-000000000000000000000000000000000",
        ] {
            assert!(ConversationId::parse(bad).is_none(), "{bad}");
        }
        let long = format!("g-{}", "0".repeat(1100));
        assert!(ConversationId::parse(&long).is_none());
    }

    #[test]
    fn stored_ids_are_validated_when_read() {
        let ok: UserId = serde_json::from_str("\"u1\"").unwrap();
        assert_eq!(ok.as_str(), "u1");
        assert!(serde_json::from_str::<UserId>("\"a b\"").is_err());
        assert!(serde_json::from_str::<ConversationId>("\"g-1\"").is_err());
    }
}
