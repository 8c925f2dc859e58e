// The OpenAI Agents SDK (@openai/agents) against the cluster, with both model
// classes (Chat Completions and Responses), whole and streamed: a tool round
// trip (the first turn must call the tool; the tool then leaves the agent, so
// the second turn answers in the agent's zod output type, which the server
// enforces), a plain text agent, and an agent whose tool takes a zod
// `.email()` parameter (strict tools: the server enforces `format: email`).
// Random weights rarely end a free answer: the Responses API then says
// "incomplete", which the SDK reports as such.
// Usage: node agents_client_test.js BASE_URL MODEL   (NODE_PATH must hold the packages)
'use strict';
process.env.OPENAI_AGENTS_DISABLE_TRACING = '1';
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const {
  Agent, run, tool, setTracingDisabled, OpenAIChatCompletionsModel, OpenAIResponsesModel,
  ModelBehaviorError,
} = require('@openai/agents');
const { z } = require('zod');

const [baseURL, model] = process.argv.slice(2);
setTracingDisabled(true);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
const models = {
  chat: new OpenAIChatCompletionsModel(client, model),
  responses: new OpenAIResponsesModel(client, model),
};
const settings = { temperature: 0, maxTokens: 200, toolChoice: 'required' };

async function check(name, fn) {
  await fn();
  console.log(`ok ${name}`);
}

// Runs `agent` on `input`, whole or streamed; the run's result.
async function runAgent(agent, input, stream) {
  if (!stream) return run(agent, input, { maxTurns: 4 });
  const result = await run(agent, input, { maxTurns: 4, stream: true });
  let events = 0;
  for await (const event of result) events += event ? 1 : 0;
  await result.completed;
  assert.ok(events > 0);
  return result;
}

// A tool the agent may call once: after its call it is disabled, so the next
// turn has no tool and answers in the output type.
function onceTool(name, parameters, execute) {
  let calls = 0;
  const t = tool({
    name,
    description: `the ${name} tool`,
    parameters,
    isEnabled: () => calls === 0,
    execute: async (args) => {
      calls++;
      return execute(args);
    },
  });
  return { tool: t, calls: () => calls };
}

async function main() {
  const Weather = z.object({ summary: z.string().max(12), celsius: z.number().int().min(-50).max(50) });
  for (const [api, m] of Object.entries(models)) {
    for (const stream of [false, true]) {
      const how = `${api}${stream ? ', streamed' : ''}`;
      await check(`tool round trip then structured output (${how})`, async () => {
        const seen = [];
        const weather = onceTool('get_weather', z.object({ city: z.string().max(10) }), ({ city }) => {
          seen.push(city);
          return `sunny, 21 C in ${city}`;
        });
        const agent = new Agent({
          name: 'forecaster', instructions: 'Use the tool, then answer.', model: m,
          tools: [weather.tool], outputType: Weather, modelSettings: settings,
        });
        const result = await runAgent(agent, 'Weather in Paris?', stream);
        assert.equal(weather.calls(), 1);
        assert.equal(typeof seen[0], 'string');
        assert.ok(seen[0].length <= 10);
        const out = Weather.parse(result.finalOutput);
        assert.ok(Number.isInteger(out.celsius));
        const kinds = result.newItems.map((i) => i.type);
        assert.ok(kinds.includes('tool_call_item') && kinds.includes('tool_call_output_item'), kinds.join());
      });

      await check(`a tool with a zod .email() parameter (${how})`, async () => {
        // .max bounds the address: the random model would lengthen an
        // unbounded one past any token budget (a cut call is "length").
        const mail = onceTool('send_mail', z.object({ to: z.string().email().max(32), subject: z.string().max(16) }),
          ({ to }) => `sent to ${to}`);
        const agent = new Agent({
          name: 'mailer', instructions: 'Send the mail, then report.', model: m,
          tools: [mail.tool], outputType: z.object({ sent: z.boolean() }), modelSettings: settings,
        });
        const result = await runAgent(agent, 'Mail bob about lunch.', stream);
        assert.equal(mail.calls(), 1);
        const call = result.newItems.find((i) => i.type === 'tool_call_item').rawItem;
        const args = JSON.parse(call.arguments);
        assert.ok(z.string().email().safeParse(args.to).success, args.to);
        assert.equal(typeof result.finalOutput.sent, 'boolean');
      });
    }
  }

  // Free text from random weights rarely ends: the SDK is told the truth
  // (finish_reason "length", status "incomplete") and says so.
  for (const [api, told] of [['chat', /finish_reason='length'/], ['responses', /incomplete/]]) {
    await check(`a plain text agent cut by maxTokens (${api}): the SDK is told so`, async () => {
      const agent = new Agent({
        name: 'talker', instructions: 'Be brief.', model: models[api],
        modelSettings: { temperature: 0, maxTokens: 16 },
      });
      await assert.rejects(run(agent, 'Say hello.'), (e) => e instanceof ModelBehaviorError && told.test(e.message));
    });
  }
}

main().then(() => console.log('all ok'), (e) => {
  console.error('FAILED:', e && e.stack ? e.stack : e);
  process.exit(1);
});
