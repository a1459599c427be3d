// npm run build: type-check everything, then
//   dist/index.js (+ .d.ts)  the SDK as one ESM module, readable
//   dist/index.min.js        the same, minified (what `npm run size` measures)
//   build/test/**            the tests, compiled for node --test
//   ../demo/dist/            the demo page: index.html, style.css, app.js
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const demo = join(root, "..", "demo");
const tsc = join(root, "node_modules", ".bin", "tsc");

for (const dir of ["dist", "build"]) rmSync(join(root, dir), { recursive: true, force: true });
rmSync(join(demo, "dist"), { recursive: true, force: true });

for (const project of ["tsconfig.json", "tsconfig.build.json"]) {
  try {
    execFileSync(tsc, ["-p", join(root, project)], { stdio: "inherit" });
  } catch {
    console.error(`build: tsc -p ${project} failed (errors above)`);
    process.exit(1);
  }
}

export const MODULES = ["safety", "attachments", "presence", "notifications"];
const sdk = { entryPoints: [join(root, "src", "index.ts")], bundle: true, format: "esm", target: "es2022", logLevel: "warning" };
await esbuild.build({ ...sdk, outfile: join(root, "dist", "index.js") });
await esbuild.build({ ...sdk, outfile: join(root, "dist", "index.min.js"), minify: true });
// The optional modules (`@chat-backend/client/safety`, `/attachments`, `/presence`, `/notifications`): each imports the SDK's own
// entry at run time (one ChatClient and ChatApiError for the app), never a copy of it.
const core = { name: "core", setup: (b) => b.onResolve({ filter: /^\.\/index\.js$/ }, () => ({ path: "./index.js", external: true })) };
for (const module of MODULES) {
  const entry = { ...sdk, entryPoints: [join(root, "src", `${module}.ts`)], plugins: [core] };
  await esbuild.build({ ...entry, outfile: join(root, "dist", `${module}.js`) });
  await esbuild.build({ ...entry, outfile: join(root, "dist", `${module}.min.js`), minify: true });
}

const tests = [];
const walk = (dir) => {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) walk(join(dir, e.name));
    else if (e.name.endsWith(".test.ts")) tests.push(join(dir, e.name));
  }
};
walk(join(root, "test"));
await esbuild.build({
  entryPoints: tests,
  outdir: join(root, "build", "test"),
  outbase: join(root, "test"),
  outExtension: { ".js": ".mjs" },
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  packages: "external",
  sourcemap: "inline",
  logLevel: "warning",
});

if (existsSync(join(demo, "src", "main.ts"))) {
  mkdirSync(join(demo, "dist"), { recursive: true });
  await esbuild.build({
    entryPoints: [join(demo, "src", "main.ts")],
    outfile: join(demo, "dist", "app.js"),
    bundle: true,
    format: "esm",
    target: "es2022",
    minify: true,
    sourcemap: true,
    logLevel: "warning",
  });
  for (const f of ["index.html", "style.css"]) cpSync(join(demo, f), join(demo, "dist", f));
}

console.log(`built dist/, build/test/ (${tests.length} test files), ${relative(root, join(demo, "dist"))}/`);
