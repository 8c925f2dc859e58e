// Runs inside a network namespace for the multi-host test and prints one JSON
// line: what a kubelet probe or a client would see.
//   probe.mjs MODULES http URL
//   probe.mjs MODULES grpc-health HOST:PORT SERVICE
//   probe.mjs MODULES chat URL MODEL PROMPT
//   probe.mjs MODULES complete URL MODEL TOKEN_IDS_JSON
import { createRequire } from 'node:module';
import path from 'node:path';

const [modules, mode, target, ...rest] = process.argv.slice(2);
const out = (o) => console.log(JSON.stringify(o));

async function http(url, init) {
  try {
    const res = await fetch(url, { ...init, signal: AbortSignal.timeout(60000) });
    out({ status: res.status, body: await res.text() });
  } catch (e) {
    out({ status: 0, error: String(e.cause ?? e) });
  }
}

function grpcHealth(address, service) {
  const require = createRequire(path.join(modules, 'x.js'));
  const grpc = require('@grpc/grpc-js');
  const protoLoader = require('@grpc/proto-loader');
  const def = protoLoader.fromJSON({ nested: { grpc: { nested: { health: { nested: { v1: { nested: {
    HealthCheckRequest: { fields: { service: { type: 'string', id: 1 } } },
    HealthCheckResponse: { fields: { status: { type: 'ServingStatus', id: 1 } },
      nested: { ServingStatus: { values: { UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3 } } } },
    Health: { methods: { Check: { requestType: 'HealthCheckRequest', responseType: 'HealthCheckResponse' } } },
  } } } } } } } }, { enums: String });
  const Health = grpc.loadPackageDefinition(def).grpc.health.v1.Health;
  const client = new Health(address, grpc.credentials.createInsecure());
  client.Check({ service }, { deadline: new Date(Date.now() + 5000) }, (err, resp) => {
    out(err ? { status: 'ERROR', error: err.message } : { status: resp.status });
    client.close();
  });
}

if (mode === 'http') await http(target);
else if (mode === 'grpc-health') grpcHealth(target, rest[0] ?? '');
else if (mode === 'chat') {
  await http(target, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: rest[0], max_tokens: 8, temperature: 0,
      messages: [{ role: 'user', content: rest[1] }] }),
  });
} else if (mode === 'complete') {
  await http(target, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: rest[0], max_tokens: 4, temperature: 0, prompt: JSON.parse(rest[1]) }),
  });
} else {
  out({ error: `unknown mode ${mode}` });
  process.exit(2);
}
