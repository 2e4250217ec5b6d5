# Sourced by the setup scripts: installs into MAILSLOT_CI_CACHE that count only once they finished.
#
# Each install is stamped (DIR/.mailslot-cache holds what was asked for) after its installer
# succeeded, and a directory without the right stamp is removed and installed anew. A version check
# alone is not enough: a CI job cut off inside `npm install` once left openclaw's package.json in
# place with @openclaw/fs-safe an empty folder, and every later run took it as installed.
#
# The caller defines say(); progress goes to stderr. Environment assignments before a call
# (`PATH=... npm_cached ...`) reach the installer.

stamp_file=.mailslot-cache

# True when DIR holds a finished install of KEY.
cache_is() { # dir key
  [[ -f "$1/$stamp_file" && "$(<"$1/$stamp_file")" == "$2" ]]
}

# npm_cached PREFIX NAME@VERSION...: the packages (and what they pull in) in PREFIX/node_modules.
npm_cached() {
  local prefix=$1
  shift
  local key="npm $*"
  if cache_is "$prefix" "$key"; then
    say "$* already in $prefix"
    return
  fi
  say "installing $* into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "$@" >&2
  local spec name version
  for spec in "$@"; do
    name="${spec%@*}" version="${spec##*@}"
    node -e 'process.exit(require(process.argv[1]).version === process.argv[2] ? 0 : 1)' \
      "$prefix/node_modules/$name/package.json" "$version" 2>/dev/null \
      || { say "npm did not install $name $version into $prefix"; return 1; }
  done
  printf '%s' "$key" >"$prefix/$stamp_file"
}

# venv_cached VENV PYTHON NAME==VERSION...: a venv made by PYTHON with the packages pip-installed.
venv_cached() {
  local venv=$1 python=$2
  shift 2
  local key="pip $*"
  if cache_is "$venv" "$key"; then
    say "$* already in $venv"
    return
  fi
  say "creating $venv with $*"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" >&2
  printf '%s' "$key" >"$venv/$stamp_file"
}
