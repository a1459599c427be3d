// npm run size: the minified SDK bundle must stay within 20 KB (issue 10's goal).
import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const LIMIT = 20 * 1024;
const file = new URL("../dist/index.min.js", import.meta.url);
const bytes = readFileSync(file);
const gzip = gzipSync(bytes).length;
const verdict = bytes.length <= LIMIT ? "ok" : "TOO BIG";
console.log(`dist/index.min.js: ${bytes.length} bytes (${(bytes.length / 1024).toFixed(1)} KB), ${gzip} bytes gzipped; limit ${LIMIT} bytes: ${verdict}`);
if (bytes.length > LIMIT) process.exit(1);
