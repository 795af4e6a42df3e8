// The sources hash of imgw-client: a SHA-256 that names exactly which sources a build
// was made from. The browser bundle's first line carries it
// ("// imgw-client <version> sources-sha256:<hex>"), so anyone can check that the
// shipped bundle matches the sources, without node.
//
// Definition:
//   files  every regular file under clients/js/src, at any depth (symlinks are not
//          followed), each named by its path relative to clients/js with "/" between
//          the parts, e.g. "src/client/client.ts"
//   order  ascending by the UTF-8 bytes of that path
//   hash   SHA-256 over, for each file in that order, the UTF-8 bytes of its path, one
//          NUL byte, then the file's bytes as they are on disk; lowercase hex
//
// The same in Python:
//   h = hashlib.sha256()
//   for p in sorted((p for p in root.joinpath("src").rglob("*") if p.is_file()
//                    and not p.is_symlink()), key=lambda p: p.relative_to(root).as_posix().encode()):
//       h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
//   h.hexdigest()
//
// Run it to print the hash of this checkout: node scripts/sources-hash.mjs

import { createHash } from "node:crypto";
import { lstatSync, readFileSync, readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** clients/js */
export const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");

/** The paths of the source files, relative to `root`, in hashing order. */
export function sourceFiles(root = ROOT) {
  const out = [];
  const walk = (rel) => {
    for (const name of readdirSync(join(root, rel))) {
      const path = `${rel}/${name}`;
      const st = lstatSync(join(root, path));
      if (st.isDirectory()) walk(path);
      else if (st.isFile()) out.push(path);
    }
  };
  walk("src");
  return out.sort((a, b) => Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8")));
}

/** The sources hash (lowercase hex) of the checkout at `root`. */
export function sourcesHash(root = ROOT) {
  const h = createHash("sha256");
  for (const path of sourceFiles(root)) {
    h.update(Buffer.from(path, "utf8"));
    h.update(Buffer.from([0]));
    h.update(readFileSync(join(root, path)));
  }
  return h.digest("hex");
}

if (process.argv[1] && fileURLToPath(import.meta.url) === resolve(process.argv[1])) {
  console.log(sourcesHash());
}
