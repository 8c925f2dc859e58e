// What the demo's tool-call round trip asks the demo model, shared by the
// demo script (tools/demo_tool_call.js) and the official-client test
// (tests/demo/demo_tool_client_test.js): the tools it is offered, the
// question, and the chat-completions settings of every turn.
'use strict';

const addTool = {
  type: 'function',
  function: {
    name: 'add',
    description: 'Adds two integers.',
    parameters: {
      type: 'object',
      properties: { a: { type: 'integer' }, b: { type: 'integer' } },
      required: ['a', 'b'],
    },
  },
};

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Gets the current weather in a city.',
    parameters: {
      type: 'object',
      properties: { location: { type: 'string', description: 'The city, e.g. Paris' } },
      required: ['location'],
    },
  },
};

const question = 'Use the add tool to add 3 and 4.';

// The conversation's first two messages: the system prompt and the question.
function firstMessages() {
  return [{ role: 'system', content: 'You are a helpful assistant.' },
          { role: 'user', content: question }];
}

// The body of one chat-completions turn: the model decides itself whether to
// call a tool (tool_choice "auto"), greedily, in at most 64 tokens.
function turnRequest(model, messages, tools) {
  return { model, messages, tools, tool_choice: 'auto', temperature: 0,
           max_completion_tokens: 64 };
}

module.exports = { addTool, weatherTool, question, firstMessages, turnRequest };
