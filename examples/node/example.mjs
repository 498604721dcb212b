// Schedule, receive and cancel a delayed message through delayd with the
// official NATS clients for Node (@nats-io/transport-node 3.x and
// @nats-io/jetstream), schedule one through the durable intake stream, show
// an error reply, and schedule a batch of envelopes in one request. Exits non-zero on the first thing that does not match
// the protocol (docs/protocol.md).
//
//   NATS_URL        NATS server (default nats://127.0.0.1:4222)
//   DELAYD_EXAMPLE_PREFIX  prefix of the target subjects (default examples.node)
//
// Run a delayd first, e.g. `go run ./cmd/delayd --embedded`.
import { connect, headers, Match } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

const url = process.env.NATS_URL || "nats://127.0.0.1:4222";
const prefix = process.env.DELAYD_EXAMPLE_PREFIX || "examples.node";
const target = `${prefix}.orders.cancel`;
// A fresh id per run, so reruns against one delayd never replace each other.
const run = `${process.pid}-${Date.now()}`;

function fail(msg) {
  console.error(`FAIL: ${msg}`);
  process.exit(1);
}

// hdr reads a header whatever the case its sender wrote it in.
const hdr = (m, k) => m.headers?.get(k, Match.IgnoreCase) ?? "";

// inbox subscribes to subject; next(ms) resolves with the next message and
// its receive time, or rejects after ms.
function inbox(nc, subject) {
  const queue = [];
  let waiter = null;
  nc.subscribe(subject, {
    callback: (err, m) => {
      if (err) fail(`subscription ${subject}: ${err.message}`);
      queue.push({ msg: m, received: Date.now() });
      if (waiter) waiter();
    },
  });
  return {
    next: (ms) => new Promise((resolve, reject) => {
      const take = () => {
        clearTimeout(timer);
        waiter = null;
        resolve(queue.shift());
      };
      const timer = setTimeout(() => {
        waiter = null;
        reject(new Error(`nothing on ${subject} within ${ms} ms`));
      }, ms);
      if (queue.length) take();
      else waiter = take;
    }),
  };
}

const nc = await connect({ servers: url }).catch((err) => fail(`connect ${url}: ${err.message}`));

// 1. Schedule a message 500 ms ahead and receive it.
const sub = inbox(nc, target);
await nc.flush();
const id = `order-${run}`;
const payload = "order 42";
const h = headers();
h.set("Delayd-Target", target);
h.set("Delayd-Delay", "500ms");
h.set("Delayd-Id", id);
h.set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"); // passes through
const rep = await nc.request("delayd.schedule", payload, { headers: h, timeout: 5000 })
  .catch((err) => fail(`schedule: ${err.message} (is delayd running?)`));
if (hdr(rep, "Nats-Service-Error-Code")) {
  fail(`schedule refused: ${hdr(rep, "Nats-Service-Error-Code")} ${hdr(rep, "Nats-Service-Error")}`);
}
const sched = rep.json();
if (sched.id !== id || !sched.deliver_at) fail(`schedule reply ${rep.string()}`);
console.log(`scheduled: ${rep.string()}`);

const { msg, received } = await sub.next(5000).catch((err) => fail(`delivery: ${err.message}`));
const due = Date.parse(hdr(msg, "Delayd-Due"));
if (msg.string() !== payload) fail(`payload changed: ${JSON.stringify(msg.string())}`);
if (hdr(msg, "Delayd-Id") !== id) fail(`Delayd-Id ${JSON.stringify(hdr(msg, "Delayd-Id"))}, want ${id}`);
if (Number.isNaN(due)) fail(`Delayd-Due ${JSON.stringify(hdr(msg, "Delayd-Due"))} is not a time`);
// Due times are whole milliseconds on Redis' clock; this compares with the
// local clock, which is the same one when delayd, Redis and this script
// share a machine.
if (received < due) fail(`delivered ${due - received} ms early (due ${hdr(msg, "Delayd-Due")})`);
if (hdr(msg, "Delayd-Attempt") !== "1") fail(`Delayd-Attempt ${JSON.stringify(hdr(msg, "Delayd-Attempt"))}, want 1`);
if (!hdr(msg, "traceparent")) fail("traceparent header did not pass through");
console.log(`delivered ${id} to ${target}: attempt 1, ${received - due} ms after due, traceparent kept`);

// 2. Schedule one 2 s ahead, cancel it, and see that nothing arrives.
const id2 = `order-${run}-paid`;
const h2 = headers();
h2.set("Delayd-Target", target);
h2.set("Delayd-Delay", "2s");
h2.set("Delayd-Id", id2);
const rep2 = await nc.request("delayd.schedule", "order 43", { headers: h2, timeout: 5000 })
  .catch((err) => fail(`schedule: ${err.message}`));
if (hdr(rep2, "Nats-Service-Error-Code")) fail(`schedule refused: ${hdr(rep2, "Nats-Service-Error")}`);
if (rep2.json().id !== id2) fail(`schedule reply ${rep2.string()}`);
console.log(`scheduled: ${rep2.string()}`);

const ch = headers();
ch.set("Delayd-Id", id2);
const crep = await nc.request("delayd.cancel", undefined, { headers: ch, timeout: 5000 })
  .catch((err) => fail(`cancel: ${err.message}`));
const cancel = crep.json();
if (cancel.id !== id2 || cancel.cancelled !== true) fail(`cancel reply ${crep.string()}, want cancelled true`);
console.log(`cancelled: ${crep.string()}`);

const late = await sub.next(3000).catch(() => null);
if (late) fail(`cancelled message arrived anyway: Delayd-Id ${hdr(late.msg, "Delayd-Id")}`);
console.log("nothing delivered within 3 s of the cancel");

// 3. Through the durable intake: a JetStream publish to delayd.intake is
// kept by the stream DELAYD_INTAKE even while no delayd runs, so it needs no
// reply from delayd, only the stream's ack.
const js = jetstream(nc);
const id3 = `order-${run}-durable`;
const h4 = headers();
h4.set("Delayd-Target", target);
h4.set("Delayd-Delay", "500ms");
h4.set("Delayd-Id", id3);
// retries: the stream may not exist yet (delayd creates it at start);
// a retried publish stays one envelope, as the Delayd-Id is the same.
const ack = await js.publish("delayd.intake", "order 44", { headers: h4, retries: 10 })
  .catch((err) => fail(`durable intake publish: ${err.message}`));
const durable = await sub.next(5000).catch((err) => fail(`durable delivery: ${err.message}`));
if (hdr(durable.msg, "Delayd-Id") !== id3) fail(`durable delivery Delayd-Id ${JSON.stringify(hdr(durable.msg, "Delayd-Id"))}, want ${id3}`);
if (durable.msg.string() !== "order 44") fail(`durable payload changed: ${JSON.stringify(durable.msg.string())}`);
console.log(`durable intake: stream ${ack.stream} seq ${ack.seq}, delivered ${id3}`);

// 4. An error reply: no Delayd-Target.
const h3 = headers();
h3.set("Delayd-Delay", "1s");
const erep = await nc.request("delayd.schedule", "no target", { headers: h3, timeout: 5000 })
  .catch((err) => fail(`bad schedule: ${err.message}`));
const code = hdr(erep, "Nats-Service-Error-Code");
if (code !== "400") fail(`missing Delayd-Target answered ${JSON.stringify(code)}, want 400`);
console.log(`error reply: ${code} ${hdr(erep, "Nats-Service-Error")}`);

// 5. Many envelopes in one request (docs/protocol.md, "Batches"): header
// Delayd-Batch: json and a JSON array of headers and base64 payloads. Each
// envelope stands alone: the one with a forbidden target is refused with its
// own code, the other is stored and delivered.
const id5 = `order-${run}-batch`;
const batch = [
  { headers: { "Delayd-Target": target, "Delayd-Delay": "500ms", "Delayd-Id": id5 }, payload: Buffer.from("order 45").toString("base64") },
  { headers: { "Delayd-Target": "$SYS.nope", "Delayd-Delay": "500ms" }, payload: Buffer.from("order 46").toString("base64") },
];
const bh = headers();
bh.set("Delayd-Batch", "json");
const brep = await nc.request("delayd.schedule", JSON.stringify(batch), { headers: bh, timeout: 5000 })
  .catch((err) => fail(`batch: ${err.message}`));
if (hdr(brep, "Nats-Service-Error-Code")) fail(`batch refused whole: ${hdr(brep, "Nats-Service-Error-Code")} ${hdr(brep, "Nats-Service-Error")}`);
const { results } = brep.json();
if (results?.length !== 2 || results[0].id !== id5 || !results[0].deliver_at || results[1].code !== 403) {
  fail(`batch reply ${brep.string()}, want ${id5} stored and the second refused 403`);
}
console.log(`batch: ${id5} stored, the second refused ${results[1].code} (${results[1].error})`);
const fromBatch = await sub.next(5000).catch((err) => fail(`batch delivery: ${err.message}`));
if (hdr(fromBatch.msg, "Delayd-Id") !== id5) fail(`batch delivery Delayd-Id ${JSON.stringify(hdr(fromBatch.msg, "Delayd-Id"))}, want ${id5}`);
if (fromBatch.msg.string() !== "order 45") fail(`batch payload changed: ${JSON.stringify(fromBatch.msg.string())}`);
console.log(`delivered ${id5} from the batch`);

await nc.drain();
console.log("ok");
