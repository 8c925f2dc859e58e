// An independent gRPC client of flotilla.v1: @grpc/grpc-js with
// @grpc/proto-loader loading proto/flotilla.proto from the source tree.
// Usage: node grpc_client_test.js SOURCE_DIR GRPC_ADDR HTTP_ADDR MODEL
// (NODE_PATH must hold the two packages). Streams Chat and Generate, checks
// bad input, cancels streams mid-way (by cancelling the call and with the
// Cancel RPC) and watches /metrics show the sequences freed. Prints one line
// per check; exits non-zero on the first failure.
'use strict';
const assert = require('node:assert/strict');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [sourceDir, grpcAddr, httpAddr, model] = process.argv.slice(2);
if (!sourceDir || !grpcAddr || !httpAddr || !model) {
  console.error('usage: node grpc_client_test.js SOURCE_DIR GRPC_ADDR HTTP_ADDR MODEL');
  process.exit(2);
}

const loaderOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
const def = protoLoader.loadSync('proto/flotilla.proto', { ...loaderOptions, includeDirs: [sourceDir] });
const v1 = grpc.loadPackageDefinition(def).flotilla.v1;
const client = new v1.Flotilla(grpcAddr, grpc.credentials.createInsecure());

// grpc.health.v1 as JSON (the package ships no .proto for it).
const healthDef = protoLoader.fromJSON({
  nested: { grpc: { nested: { health: { nested: { v1: { nested: {
    HealthCheckRequest: { fields: { service: { type: 'string', id: 1 } } },
    HealthCheckResponse: {
      fields: { status: { type: 'ServingStatus', id: 1 } },
      nested: { ServingStatus: { values: { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 } } },
    },
    Health: { methods: { Check: { requestType: 'HealthCheckRequest', responseType: 'HealthCheckResponse' } } },
  } } } } } } },
}, loaderOptions);
const health = new (grpc.loadPackageDefinition(healthDef).grpc.health.v1.Health)(
  grpcAddr, grpc.credentials.createInsecure());

const deadline = (s) => new Date(Date.now() + s * 1000);

function unary(c, method, req) {
  return new Promise((resolve, reject) => {
    c[method](req, { deadline: deadline(30) }, (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

// Runs a server stream to its end. `onData(msg, call)` may cancel the call.
// Resolves {messages, status} where status is the gRPC status object.
function stream(method, req, onData = () => {}, seconds = 120) {
  return new Promise((resolve) => {
    const messages = [];
    const call = client[method](req, { deadline: deadline(seconds) });
    let error = null;
    call.on('data', (m) => {
      messages.push(m);
      onData(m, call);
    });
    call.on('error', (e) => { error = e; });
    call.on('status', (st) => {
      // 'status' comes after the last 'data'; 'error' (if any) before it.
      setImmediate(() => resolve({ messages, status: st, error }));
    });
  });
}

async function metrics() {
  const r = await fetch(`http://${httpAddr}/metrics`);
  assert.equal(r.status, 200);
  const text = await r.text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name}(\\{[^}]*\\})? ([0-9.e+-]+)$`, 'm'));
    assert.ok(m, `metric ${name} missing`);
    return Number(m[2]);
  };
  return {
    inFlight: value('flotilla_requests_in_flight'),
    running: value('flotilla_running_sequences'),
    cancelled: value('flotilla_requests_cancelled_total'),
  };
}

// Polls /metrics until no request is in flight and no sequence runs.
async function waitIdle(what) {
  let m;
  for (let i = 0; i < 100; i++) {
    m = await metrics();
    if (m.inFlight === 0 && m.running === 0) return m;
    await new Promise((r) => setTimeout(r, 100));
  }
  assert.fail(`${what}: still busy after 10 s: ${JSON.stringify(m)}`);
}

const chatRequest = (maxTokens, extra = {}) => ({
  messages: [
    { role: 'SYSTEM', content: 'You are terse.' },
    { role: 'USER', content: 'What is the capital of France?' },
  ],
  reasoning_effort: 'LOW',
  sampling: { temperature: 0, max_tokens: maxTokens },
  ...extra,
});

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

async function main() {
  await check('health SERVING', async () => {
    const r = await unary(health, 'Check', { service: 'flotilla.v1.Flotilla' });
    assert.equal(r.status, 'SERVING');
  });

  await check('ListModels', async () => {
    const r = await unary(client, 'ListModels', {});
    assert.equal(r.models.length, 1);
    assert.equal(r.models[0].id, model);
    assert.equal(r.models[0].state, 'ready');
    assert.equal(r.models[0].vocab_size, 201088);
  });

  await check('Generate streams tokens and text', async () => {
    const { messages, status } = await stream('Generate', {
      text: 'Hello there', sampling: { temperature: 0, max_tokens: 8 },
    });
    assert.equal(status.code, grpc.status.OK, status.details);
    const ids = messages.flatMap((m) => m.token_ids);
    const last = messages[messages.length - 1];
    assert.ok(['STOP', 'LENGTH'].includes(last.finish_reason), last.finish_reason);
    const stopped = last.stop_token !== undefined && last.stop_token !== null;
    assert.equal(last.usage.completion_tokens, ids.length + (stopped ? 1 : 0));
    assert.ok(last.usage.prompt_tokens >= 2);
    assert.ok(ids.length <= 8 && ids.length > 0);
    for (const m of messages.slice(0, -1)) assert.equal(m.finish_reason, 'FINISH_REASON_UNSPECIFIED');
  });

  await check('Chat streams reasoning, answer and tool calls apart', async () => {
    const { messages, status } = await stream('Chat', chatRequest(24, { return_token_ids: true }));
    assert.equal(status.code, grpc.status.OK, status.details);
    assert.ok(messages.length >= 2);
    assert.ok(/^[0-9a-f]{32}$/.test(messages[0].request_id), messages[0].request_id);
    assert.equal(messages[0].deltas.length, 0, 'the first message only names the request');
    let reasoning = '', content = '', finishes = 0;
    for (const m of messages) {
      assert.equal(m.request_id, messages[0].request_id);
      for (const d of m.deltas) {
        // Exactly one channel per delta (the oneof).
        const set = ['reasoning', 'content', 'tool_call'].filter((k) => d[k] !== undefined && d[k] !== null);
        assert.deepEqual(set, [d.delta], JSON.stringify(d));
        if (d.delta === 'reasoning') reasoning += d.reasoning;
        if (d.delta === 'content') content += d.content;
      }
      if (m.finish_reason !== 'FINISH_REASON_UNSPECIFIED') finishes++;
    }
    assert.equal(finishes, 1);
    const last = messages[messages.length - 1];
    assert.ok(['STOP', 'LENGTH', 'TOOL_CALLS'].includes(last.finish_reason), last.finish_reason);
    assert.ok(last.usage.prompt_tokens > 20, `prompt_tokens ${last.usage.prompt_tokens}`);
    assert.ok(last.usage.completion_tokens > 0 && last.usage.completion_tokens <= 24);
    // The raw completion streamed as it was generated: every token, in order.
    const raw = messages.flatMap((m) => m.token_ids);
    assert.equal(raw.length, last.usage.completion_tokens);
    assert.ok(messages.length >= 3, `${messages.length} messages for ${raw.length} tokens`);
    console.log(`   chat: ${last.usage.completion_tokens} tokens, ${reasoning.length} chars of reasoning, ` +
                `${content.length} chars of answer, finish ${last.finish_reason}`);
  });

  await check('Chat bad input is INVALID_ARGUMENT naming the field', async () => {
    let r = await stream('Chat', { messages: [] });
    assert.equal(r.status.code, grpc.status.INVALID_ARGUMENT);
    assert.match(r.status.details, /^messages: /);
    r = await stream('Chat', chatRequest(4, {
      messages: [{ role: 'USER', content: 'hi' }, { role: 'TOOL', content: '42' }],
    }));
    assert.equal(r.status.code, grpc.status.INVALID_ARGUMENT);
    assert.match(r.status.details, /^messages\[1\]\.tool_call_id: /);
    r = await stream('Chat', chatRequest(4, { tools: [{ name: 'f', parameters_json: '{oops' }] }));
    assert.equal(r.status.code, grpc.status.INVALID_ARGUMENT);
    assert.match(r.status.details, /^tools\[0\]\.parameters_json: /);
    r = await stream('Generate', { sampling: { max_tokens: 4 } });
    assert.equal(r.status.code, grpc.status.INVALID_ARGUMENT);
  });

  await check('cancelling a Generate stream mid-way frees its sequence', async () => {
    const before = await waitIdle('before');
    let n = 0;
    const { messages, status } = await stream('Generate', {
      text: 'Tell me a long story', sampling: { temperature: 1, max_tokens: 0 },
    }, (m, call) => {
      if (++n === 4) call.cancel();  // four steps in, thousands to go
    });
    assert.equal(n, 4);
    assert.equal(status.code, grpc.status.CANCELLED, status.details);
    assert.ok(messages.every((m) => m.finish_reason === 'FINISH_REASON_UNSPECIFIED'), 'it had not finished');
    const after = await waitIdle('after cancelling Generate');
    assert.ok(after.cancelled >= before.cancelled + 1,
              `cancelled counter ${before.cancelled} -> ${after.cancelled}`);
  });

  await check('cancelling a Chat stream mid-way frees its sequence', async () => {
    const before = await waitIdle('before');
    // A Chat reply streams deltas only once the model opens a message (the
    // synthetic model may not for a while): cancel 0.5 s after admission,
    // while it generates up to the context length.
    let n = 0;
    const { status } = await stream('Chat', chatRequest(0, { sampling: { temperature: 1 } }), (m, call) => {
      if (++n === 1) setTimeout(() => call.cancel(), 500);
    });
    assert.equal(status.code, grpc.status.CANCELLED, status.details);
    const after = await waitIdle('after cancelling Chat');
    assert.ok(after.cancelled >= before.cancelled + 1,
              `cancelled counter ${before.cancelled} -> ${after.cancelled}`);
  });

  await check('Cancel RPC ends a Chat stream with finish_reason CANCELLED', async () => {
    const before = await waitIdle('before');
    let id = null, found = null;
    const { messages, status } = await stream('Chat', chatRequest(0, { sampling: { temperature: 1 } }), (m) => {
      if (id !== null) return;
      id = m.request_id;
      setTimeout(() => unary(client, 'Cancel', { request_id: id }).then((r) => { found = r.found; }), 500);
    });
    assert.equal(status.code, grpc.status.OK, status.details);
    const last = messages[messages.length - 1];
    assert.equal(last.finish_reason, 'CANCELLED');
    assert.ok(last.usage.completion_tokens > 0);
    await new Promise((r) => setTimeout(r, 50));
    assert.equal(found, true);
    const after = await waitIdle('after Cancel');
    assert.ok(after.cancelled >= before.cancelled + 1);
  });

  client.close();
  health.close();
  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
