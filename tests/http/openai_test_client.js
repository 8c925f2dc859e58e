// What the node client tests share: their command line (BASE_URL MODEL), an
// `openai` client on it that never retries, and `check`, which runs one named
// check and prints `ok NAME` once it passed (a failure ends the program).
'use strict';
const OpenAI = require('openai');

// { baseURL, model, client } from `node SCRIPT BASE_URL MODEL`; exits 2 with
// the usage when either is missing. `timeout`: the client's, in ms.
function clientFromArgs(script, timeout) {
  const [baseURL, model] = process.argv.slice(2);
  if (!baseURL || !model) {
    console.error(`usage: node ${script} BASE_URL MODEL`);
    process.exit(2);
  }
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout });
  return { baseURL, model, client };
}

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

module.exports = { clientFromArgs, check };
