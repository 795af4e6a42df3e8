// The browser bundle: src/browser.ts (WebSocket transport only) and everything it
// imports, @msgpack/msgpack included, in ONE ES module that fetches nothing from
// elsewhere: gateway/web/imgw-client.js. Its first line names the version and the
// sources hash (scripts/sources-hash.mjs). The output depends only on the sources and
// the locked esbuild: the same checkout always builds the same bytes.
//
//   node scripts/build-web.mjs              write gateway/web/imgw-client.js
//   node scripts/build-web.mjs --out FILE   write FILE instead
//   node scripts/build-web.mjs --check      exit 1 unless the shipped file is what
//                                           the sources build

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { ROOT, sourcesHash } from "./sources-hash.mjs";

export const SHIPPED = join(ROOT, "..", "..", "gateway", "web", "imgw-client.js");

/** The bundle's text. */
export async function bundle() {
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
  const msgpack = JSON.parse(readFileSync(join(ROOT, "node_modules", "@msgpack", "msgpack", "package.json"), "utf8"));
  const banner = [
    `// imgw-client ${pkg.version} sources-sha256:${sourcesHash()}`,
    `// Built by clients/js (npm run build:web) from src/browser.ts; do not edit. Bundles`,
    `// @msgpack/msgpack ${msgpack.version} (${msgpack.license} licence).`,
  ].join("\n");
  const result = await build({
    absWorkingDir: ROOT,
    entryPoints: ["src/browser.ts"],
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    charset: "utf8",
    legalComments: "inline",
    sourcemap: false,
    minify: false,
    write: false,
    banner: { js: banner },
    logLevel: "warning",
  });
  return result.outputFiles[0].text;
}

async function main() {
  const args = process.argv.slice(2);
  const text = await bundle();
  if (args[0] === "--check") {
    let shipped = "";
    try {
      shipped = readFileSync(SHIPPED, "utf8");
    } catch {
      // missing: stale
    }
    if (shipped !== text) {
      console.error(`${SHIPPED} is not what the sources build: run npm run build:web`);
      process.exit(1);
    }
    console.log(`${SHIPPED}: up to date`);
    return;
  }
  const out = args[0] === "--out" && args[1] ? resolve(args[1]) : SHIPPED;
  mkdirSync(dirname(out), { recursive: true });
  writeFileSync(out, text);
  console.log(`${out}: ${text.length} bytes, ${text.split("\n", 1)[0]}`);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === resolve(process.argv[1])) await main();
