#!/usr/bin/env bash
# Packs mailslot's npm packages from a built binary: `@mailslot/PLATFORM`, which holds the binary,
# and `mailslot`, whose `mailslot` command runs it (packaging/npm/mailslot). Both carry the
# version in Cargo.toml; the script refuses to pack when packaging/npm/mailslot/package.json says
# another.
#
#   packaging/npm/pack.sh BINARY PLATFORM OUT_DIR
#
# PLATFORM is one of linux-x64, linux-arm64, darwin-x64, darwin-arm64 (npm's `os`-`cpu` names).
# The tarballs land in OUT_DIR; their names are printed on stdout, one a line.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: $0 BINARY PLATFORM OUT_DIR" >&2; exit 2; }
binary="$1" platform="$2" out="$3"
root="$(cd "$(dirname "$0")/../.." && pwd)"

case "$platform" in
  linux-x64 | linux-arm64) libc='"libc": ["glibc"],' ;;
  darwin-x64 | darwin-arm64) libc='' ;;
  *) echo "pack.sh: unknown platform '$platform' (linux-x64, linux-arm64, darwin-x64, darwin-arm64)" >&2; exit 2 ;;
esac
os="${platform%-*}" cpu="${platform#*-}"
[[ -x "$binary" ]] || { echo "pack.sh: $binary is not an executable file" >&2; exit 2; }

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
shim_json="$root/packaging/npm/mailslot/package.json"
node -e '
  const [file, version] = process.argv.slice(1);
  const pkg = require(file);
  const wrong = [["version", pkg.version], ...Object.entries(pkg.optionalDependencies)]
    .filter(([, v]) => v !== version);
  if (wrong.length) {
    console.error(`pack.sh: ${file} must carry the version of Cargo.toml, ${version}, but says ` +
      wrong.map(([k, v]) => `${k}: ${v}`).join(", "));
    process.exit(1);
  }' "$shim_json" "$version"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT

# The platform's package: the binary and nothing to run at install time.
mkdir -p "$stage/platform/bin"
cp "$binary" "$stage/platform/bin/mailslot"
chmod 0755 "$stage/platform/bin/mailslot"
cat >"$stage/platform/package.json" <<EOF
{
  "name": "@mailslot/$platform",
  "version": "$version",
  "description": "The mailslot binary for $os $cpu; install the package mailslot, which runs it",
  "license": "MIT",
  "os": ["$os"],
  "cpu": ["$cpu"],
  $libc
  "files": ["bin/mailslot"],
  "preferUnplugged": true
}
EOF
cp "$root/packaging/package-readme.md" "$stage/platform/README.md"

# The package users name: the shim, which finds the platform's package at run time.
cp -R "$root/packaging/npm/mailslot" "$stage/shim"
cp "$root/packaging/package-readme.md" "$stage/shim/README.md"

for dir in platform shim; do
  (cd "$stage/$dir" && npm pack --silent --pack-destination "$out") | while read -r name; do
    echo "$out/$name"
  done
done
