#!/usr/bin/env bash
# Raw HTTP edge cases against hyflow-serve --tiny with curl: bad JSON, an oversized body, a
# wrong or missing bearer token, a non-loopback bind without a token, and a client that
# disconnects mid-stream (its slot frees: with --max-in-flight 1 the next request is served).
# Usage: curl_edges.sh <hyflow-serve>
here=$(cd "$(dirname "$0")" && pwd)
source "$here/serve_common.sh"
serve_bin=$1
command -v curl >/dev/null || { echo "FAIL: curl is required" >&2; exit 1; }

fail() { echo "FAIL: $*" >&2; cat "$work/serve.log" >&2; exit 1; }
# status <curl args...>: the HTTP status; the body lands in $work/body
status() { curl -s -o "$work/body" -w '%{http_code}' --max-time 20 "$@"; }

if "$serve_bin" --tiny --host 0.0.0.0 --port 0 >"$work/open.log" 2>&1; then fail "a non-loopback bind without a token started"; fi
grep -q "requires a bearer token" "$work/open.log" || fail "no reason given for refusing the open bind"

echo "k3y" >"$work/key"
start_serve "$serve_bin" --api-key-file "$work/key" --max-body-bytes 2048 --max-in-flight 1 \
  --max-positions 4096 --max-tokens 4000
auth=(-H "Authorization: Bearer k3y")
json=(-H "Content-Type: application/json")

[ "$(status "$base/health")" = 401 ] || fail "no token: expected 401"
[ "$(status -H "Authorization: Bearer wrong" "$base/health")" = 401 ] || fail "wrong token: expected 401"
grep -q '"authentication_error"' "$work/body" || fail "401 without an error object"
[ "$(status "${auth[@]}" "$base/health")" = 200 ] || fail "health: expected 200"

[ "$(status "${auth[@]}" "${json[@]}" -d '{"messages": [' "$base/v1/chat/completions")" = 400 ] || fail "bad JSON: expected 400"
grep -q '"invalid_request_error"' "$work/body" || fail "bad JSON: no error object"
[ "$(status "${auth[@]}" "${json[@]}" -d '{"messages": [{"role": "user", "content": "x"}], "n": "two"}' \
  "$base/v1/chat/completions")" = 400 ] || fail "bad field: expected 400"
grep -q '"param":"n"' "$work/body" || fail "the 400 does not name the field: $(cat "$work/body")"

head -c 4096 /dev/zero | tr '\0' ' ' >"$work/big"
[ "$(status "${auth[@]}" "${json[@]}" --data-binary @"$work/big" "$base/v1/completions")" = 413 ] || fail "oversize: expected 413"
[ "$(status "${auth[@]}" "$base/v1/nothing")" = 404 ] || fail "unknown route: expected 404"

# A long stream, dropped after half a second.
curl -s -N --max-time 0.5 "${auth[@]}" "${json[@]}" \
  -d '{"prompt": "abc", "max_tokens": 4000, "temperature": 0, "stream": true, "ignore_eos": true}' \
  "$base/v1/completions" \
  >"$work/stream" || true
grep -q '^data: {' "$work/stream" || fail "no event arrived before the disconnect"
for _ in $(seq 1 50); do
  code=$(status "${auth[@]}" "${json[@]}" -d '{"prompt": "x", "max_tokens": 2}' "$base/v1/completions")
  [ "$code" = 200 ] && break
  [ "$code" = 429 ] || fail "after the disconnect: expected 200 or 429, got $code"
  sleep 0.05
done
[ "$code" = 200 ] || fail "the disconnected stream still holds the only slot after 2.5 s"
status "${auth[@]}" "$base/health" >/dev/null
grep -q '"cancelled":1' "$work/body" || fail "the engine did not count the cancelled stream: $(cat "$work/body")"
echo "curl edge cases: ok"
