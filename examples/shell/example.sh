#!/usr/bin/env bash
# Schedule, receive and cancel a delayed message through delayd with the nats
# CLI (natscli v0.5.0), show an error reply, and schedule a batch. Exits non-zero on the first
# thing that does not match the protocol (docs/protocol.md).
#
#   NATS_URL  NATS server (default nats://127.0.0.1:4222)
#
# Run a delayd first, e.g. `go run ./cmd/delayd --embedded`. Every nats
# command below is the README's, character for character (the README's
# "From any language" snippet; cmd/delayd/examples_test.go checks both ways),
# with only the shell plumbing around it to capture what it prints.
set -euo pipefail

# natscli takes NATS_URL as its --server flag (nats --help: "-s, --server=URL
# ($NATS_URL)"), so it wins over a selected natscli context too.
export NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}

fail() {
	echo "FAIL: $*" >&2
	exit 1
}

out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

# natscli logs "Subscribing on" just before it subscribes; the delays below
# leave it ample time to finish.
wait_subscribed() {
	for _ in $(seq 100); do
		grep -q 'Subscribing on' "$1" && return 0
		sleep 0.05
	done
	fail "the subscriber did not start: $(cat "$1")"
}

# 1. Schedule a message 1 s ahead and receive it.
{ nats sub --count 1 orders.cancel & } >"$out/delivery" 2>&1
sub=$!
wait_subscribed "$out/delivery"
reply=$(nats req delayd.schedule 'order 42' -H Delayd-Target:orders.cancel -H Delayd-Delay:1s -H Delayd-Id:order-42 -H traceparent:00-abc-01 2>"$out/schedule.err") ||
	fail "schedule: $(cat "$out/schedule.err")"
[[ $reply == '{"id":"order-42","deliver_at":"'*'"}' ]] || fail "schedule reply: $reply $(cat "$out/schedule.err")"
echo "scheduled: $reply"

timeout 5 tail --pid "$sub" -f /dev/null || fail "nothing delivered within 5 s: $(cat "$out/delivery")"
# The shell sees when nats sub exited, just after the delivery arrived; the
# Node example compares with the exact receive time.
received=$(date +%s%3N)
header() { sed -n "s/^$1: //p" "$out/delivery"; }
due=$(header Delayd-Due)
[[ -n $due ]] || fail "no Delayd-Due in: $(cat "$out/delivery")"
((received >= $(date -d "$due" +%s%3N))) || fail "delivered before Delayd-Due $due"
[[ $(header Delayd-Id) == order-42 ]] || fail "Delayd-Id is not order-42: $(cat "$out/delivery")"
[[ $(header Delayd-Attempt) == 1 ]] || fail "Delayd-Attempt is not 1: $(cat "$out/delivery")"
[[ $(header traceparent) == 00-abc-01 ]] || fail "traceparent did not pass through: $(cat "$out/delivery")"
grep -qx 'order 42' "$out/delivery" || fail "payload changed: $(cat "$out/delivery")"
echo "delivered order-42 to orders.cancel: attempt 1, due $due, traceparent kept"

# 2. Schedule one 2 s ahead, cancel it, and see that nothing arrives.
reply=$(nats req delayd.schedule 'order 43' -H Delayd-Target:orders.cancel -H Delayd-Delay:2s -H Delayd-Id:order-43 2>"$out/schedule.err") ||
	fail "schedule: $(cat "$out/schedule.err")"
[[ $reply == '{"id":"order-43","deliver_at":"'*'"}' ]] || fail "schedule reply: $reply $(cat "$out/schedule.err")"
echo "scheduled: $reply"
reply=$(nats req delayd.cancel '' -H Delayd-Id:order-43 2>"$out/cancel.err") || fail "cancel: $(cat "$out/cancel.err")"
[[ $reply == '{"id":"order-43","cancelled":true}' ]] || fail "cancel reply: $reply"
echo "cancelled: $reply"
nats sub --count 1 --wait 3s orders.cancel >"$out/late" 2>&1 || fail "nats sub: $(cat "$out/late")"
! grep -q 'Received on' "$out/late" || fail "cancelled message arrived anyway: $(cat "$out/late")"
echo "nothing delivered within 3 s of the cancel"

# 3. An error reply: no Delayd-Target. natscli prints the reply's headers on
# stderr.
error=$(nats req delayd.schedule 'order 44' -H Delayd-Delay:1s 2>&1) || fail "schedule: $error"
code=$(sed -n 's/.*Nats-Service-Error-Code: //p' <<<"$error")
[[ $code == 400 ]] || fail "missing Delayd-Target answered ${code:-no error code}, want 400: $error"
echo "error reply: $code $(sed -n 's/.*Nats-Service-Error: //p' <<<"$error")"

# 4. A batch: two envelopes in one request (header Delayd-Batch, a JSON array
# of headers and base64 payloads). The one with a wildcard target is refused
# alone (its own 400 in the results); the other is stored and delivered.
{ nats sub --count 1 orders.cancel & } >"$out/batch-delivery" 2>&1
sub=$!
wait_subscribed "$out/batch-delivery"
reply=$(nats req delayd.schedule '[{"headers":{"Delayd-Target":"orders.cancel","Delayd-Delay":"1s","Delayd-Id":"order-45"},"payload":"b3JkZXIgNDU="},{"headers":{"Delayd-Target":"orders.*","Delayd-Delay":"1s"},"payload":"b3JkZXIgNDY="}]' -H Delayd-Batch:json 2>"$out/batch.err") ||
	fail "batch: $(cat "$out/batch.err")"
[[ $reply == '{"results":[{"id":"order-45","deliver_at":"'*'"},{"code":400,"error":"'*'"}]}' ]] || fail "batch reply: $reply $(cat "$out/batch.err")"
echo "batch: $reply"
timeout 5 tail --pid "$sub" -f /dev/null || fail "nothing of the batch delivered within 5 s: $(cat "$out/batch-delivery")"
[[ $(sed -n 's/^Delayd-Id: //p' "$out/batch-delivery") == order-45 ]] || fail "Delayd-Id is not order-45: $(cat "$out/batch-delivery")"
grep -qx 'order 45' "$out/batch-delivery" || fail "payload changed: $(cat "$out/batch-delivery")"
echo "delivered order-45 from the batch"

echo ok
