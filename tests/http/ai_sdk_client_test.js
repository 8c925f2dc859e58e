// The Vercel AI SDK (`ai` + `@ai-sdk/openai`) against the cluster, with the
// provider's three model kinds (chat completions, Responses, completions):
// generateText and streamText (random weights run to the token limit: finish
// reason "length"), a required tool call executed by the SDK (also with a
// zod `.email()` parameter), structured objects (generateObject,
// streamObject, generateText with Output.object) that the server enforces.
// Usage: node ai_sdk_client_test.js BASE_URL MODEL   (NODE_PATH must hold the packages)
'use strict';
const assert = require('node:assert/strict');
const { generateText, streamText, generateObject, streamObject, tool, stepCountIs, Output } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');
globalThis.AI_SDK_LOG_WARNINGS = false;  // deprecation notes of generateObject/streamObject
const { z } = require('zod');

const [baseURL, model] = process.argv.slice(2);
const provider = createOpenAI({ baseURL, apiKey: 'unused' });
const models = { chat: provider.chat(model), responses: provider.responses(model) };
const common = { temperature: 0, maxRetries: 0 };

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

const Weather = z.object({ summary: z.string().max(12), celsius: z.number().int().min(-50).max(50) });

async function main() {
  for (const [api, m] of Object.entries(models)) {
    await check(`generateText and streamText (${api})`, async () => {
      const r = await generateText({ ...common, model: m, prompt: 'Say hello.', maxOutputTokens: 16 });
      assert.equal(typeof r.text, 'string');
      assert.equal(r.finishReason, 'length');
      assert.equal(r.usage.outputTokens, 16);
      const s = streamText({ ...common, model: m, prompt: 'Say hello.', maxOutputTokens: 16 });
      let text = '';
      for await (const piece of s.textStream) text += piece;
      assert.equal(await s.finishReason, 'length');
      assert.equal(text, r.text);
    });

    for (const [what, parameters] of [
      ['a tool', z.object({ city: z.string().max(10) })],
      // .max bounds the address: the random model would lengthen an unbounded one.
      ['a tool with a zod .email() parameter', z.object({ to: z.string().email().max(32) })],
    ]) {
      await check(`${what}, required, executed by the SDK (${api})`, async () => {
        const seen = [];
        const r = await generateText({
          ...common, model: m, prompt: 'Use the tool.', maxOutputTokens: 200, toolChoice: 'required',
          tools: { act: tool({ description: 'acts', inputSchema: parameters, execute: async (a) => { seen.push(a); return 'done'; } }) },
          stopWhen: stepCountIs(1),
        });
        assert.equal(r.finishReason, 'tool-calls');
        assert.equal(r.toolCalls.length, 1);
        assert.equal(seen.length, 1);
        assert.ok(parameters.safeParse(seen[0]).success, JSON.stringify(seen[0]));
        assert.equal(r.toolResults[0].output, 'done');
        const s = streamText({
          ...common, model: m, prompt: 'Use the tool.', maxOutputTokens: 200, toolChoice: 'required',
          tools: { act: tool({ description: 'acts', inputSchema: parameters, execute: async () => 'done' }) },
          stopWhen: stepCountIs(1),
        });
        const calls = [];
        for await (const part of s.fullStream) if (part.type === 'tool-call') calls.push(part.input);
        assert.equal(await s.finishReason, 'tool-calls');
        assert.equal(calls.length, 1);
        assert.ok(parameters.safeParse(calls[0]).success, JSON.stringify(calls[0]));
      });
    }

    await check(`structured objects: generateObject, streamObject, Output.object (${api})`, async () => {
      const o = await generateObject({ ...common, model: m, schema: Weather, prompt: 'Weather?', maxOutputTokens: 200 });
      Weather.parse(o.object);
      assert.equal(o.finishReason, 'stop');
      const s = streamObject({ ...common, model: m, schema: Weather, prompt: 'Weather?', maxOutputTokens: 200 });
      for await (const partial of s.partialObjectStream) assert.equal(typeof partial, 'object');
      Weather.parse(await s.object);
      const t = await generateText({
        ...common, model: m, prompt: 'Weather?', maxOutputTokens: 200, output: Output.object({ schema: Weather }),
      });
      Weather.parse(t.output);
    });
  }

  await check('completions model: generateText and streamText', async () => {
    const m = provider.completion(model);
    const r = await generateText({ ...common, model: m, prompt: 'Say hello.', maxOutputTokens: 8 });
    assert.equal(r.finishReason, 'length');
    assert.equal(r.usage.outputTokens, 8);
    const s = streamText({ ...common, model: m, prompt: 'Say hello.', maxOutputTokens: 8 });
    let text = '';
    for await (const piece of s.textStream) text += piece;
    assert.equal(text, r.text);
  });
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
