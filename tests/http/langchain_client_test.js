// LangChain JS (@langchain/openai) against the cluster: ChatOpenAI on chat
// completions and on the Responses API (invoke, stream, batch; random weights
// run to the token limit, which the response metadata says), tools bound with
// a required choice (also a zod `.email()` parameter), withStructuredOutput
// (json schema and function calling), and the completions LLM.
// Usage: node langchain_client_test.js BASE_URL MODEL   (NODE_PATH must hold the packages)
'use strict';
const assert = require('node:assert/strict');
const { ChatOpenAI, OpenAI: OpenAILLM } = require('@langchain/openai');
const { tool } = require('@langchain/core/tools');
const { z } = require('zod');

const [baseURL, model] = process.argv.slice(2);
const base = { model, apiKey: 'unused', configuration: { baseURL }, temperature: 0, maxRetries: 0 };
const chats = {
  chat: (extra) => new ChatOpenAI({ ...base, ...extra }),
  responses: (extra) => new ChatOpenAI({ ...base, useResponsesApi: true, ...extra }),
};

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

const Weather = z.object({ summary: z.string().max(12), celsius: z.number().int().min(-50).max(50) });

// The finish reason LangChain reports for a message of either API.
function finishOf(message) {
  const m = message.response_metadata || {};
  return m.finish_reason ?? m.status;
}

async function main() {
  for (const [api, make] of Object.entries(chats)) {
    await check(`invoke, stream and batch (${api})`, async () => {
      const llm = make({ maxTokens: 16 });
      const whole = await llm.invoke('Say hello.');
      assert.equal(typeof whole.content === 'string' || Array.isArray(whole.content), true);
      assert.ok(['length', 'incomplete'].includes(finishOf(whole)), JSON.stringify(whole.response_metadata));
      assert.equal(whole.usage_metadata.output_tokens, 16);
      let chunks = 0;
      for await (const chunk of await llm.stream('Say hello.')) chunks += chunk ? 1 : 0;
      assert.ok(chunks > 0);
      const both = await llm.batch(['Say hello.', 'Say bye.']);
      assert.equal(both.length, 2);
    });

    for (const [what, schema] of [
      ['a tool', z.object({ city: z.string().max(10) })],
      // .max bounds the address: the random model would lengthen an unbounded one.
      ['a tool with a zod .email() parameter', z.object({ to: z.string().email().max(32) })],
    ]) {
      await check(`${what}, bound with a required choice (${api})`, async () => {
        const act = tool(async () => 'done', { name: 'act', description: 'acts', schema });
        // LangChain 1.6's Responses path drops bindTools' tool_choice: the
        // request's own field carries it there.
        const extra = api === 'responses' ? { modelKwargs: { tool_choice: 'required' } } : {};
        const llm = make({ maxTokens: 200, ...extra }).bindTools([act], { tool_choice: 'required', strict: true });
        const ai = await llm.invoke('Use the tool.');
        assert.equal(ai.tool_calls.length, 1, JSON.stringify(ai));
        assert.equal(ai.tool_calls[0].name, 'act');
        assert.ok(schema.safeParse(ai.tool_calls[0].args).success, JSON.stringify(ai.tool_calls[0].args));
        assert.equal(await act.invoke(ai.tool_calls[0].args), 'done');
        let merged;
        for await (const chunk of await llm.stream('Use the tool.')) merged = merged ? merged.concat(chunk) : chunk;
        assert.equal(merged.tool_calls.length, 1);
        assert.ok(schema.safeParse(merged.tool_calls[0].args).success);
      });
    }

    for (const method of ['jsonSchema', 'functionCalling']) {
      await check(`withStructuredOutput, ${method} (${api})`, async () => {
        const llm = make({ maxTokens: 200 }).withStructuredOutput(Weather, { method, strict: true });
        Weather.parse(await llm.invoke('Weather?'));
      });
    }
  }

  await check('the completions LLM: invoke and stream', async () => {
    const llm = new OpenAILLM({ ...base, maxTokens: 8 });
    const text = await llm.invoke('Say hello.');
    assert.equal(typeof text, 'string');
    let streamed = '';
    for await (const piece of await llm.stream('Say hello.')) streamed += piece;
    assert.equal(streamed, text);
  });
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
