# Sourced by the tests that drive hyflow with the official `openai` npm client:
# install_openai_npm <work-dir> installs the package into a cache folder ($HYFLOW_NPM_CACHE,
# default ~/.cache/hyflow-npm) once and sets $openai_module to its folder. Exits 77 (skipped,
# with the reason) without node/npm or when the npm registry is unreachable; under CI=true a
# missing node/npm fails, and an install failure with a reachable registry always fails.
install_openai_npm() {
  local work=$1
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [ "${CI:-}" = "true" ]; then echo "FAIL: node and npm are required under CI=true" >&2; exit 1; fi
    echo "SKIPPED: node or npm is not installed"
    exit 77
  fi
  local cache=${HYFLOW_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyflow-npm}
  mkdir -p "$cache"
  if [ ! -f "$cache/node_modules/openai/package.json" ]; then
    if ! timeout 120 npm install --prefix "$cache" --no-audit --no-fund --loglevel=error openai@4 \
      >"$work/npm.log" 2>&1; then
      if ! timeout 20 npm ping >"$work/ping.log" 2>&1; then
        echo "SKIPPED: the npm registry is unreachable ($(tail -1 "$work/ping.log"))"
        exit 77
      fi
      cat "$work/npm.log" >&2
      echo "FAIL: npm install openai failed although the registry answers" >&2
      exit 1
    fi
  fi
  openai_module="$cache/node_modules/openai"
  echo "openai package $(node -p "require('$openai_module/package.json').version")"
}
