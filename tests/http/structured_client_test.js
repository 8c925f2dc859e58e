// Structured outputs through the official `openai` npm client: on the random
// synthetic model every json_schema answer parses and validates, every
// required tool call's arguments validate, unsupported schema features are a
// 400 naming them, and logit_bias +100 makes a token the greedy choice.
// Usage: node structured_client_test.js BASE_URL MODEL   (NODE_PATH must hold `openai`)
'use strict';
const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { check, clientFromArgs } = require('./openai_test_client');

const { model, client } = clientFromArgs('structured_client_test.js', 300000);
const messages = [{ role: 'user', content: 'Answer in JSON.' }];

// A validator of the JSON Schema subset, written from the JSON Schema rules.
function validate(schema, v, root, path = '$') {
  const fail = (why) => { throw new Error(`${path}: ${why} (${JSON.stringify(v)})`); };
  if (schema.$ref) return validate(root.$defs[schema.$ref.split('/').pop()], v, root, path);
  if (schema.anyOf) {
    for (const a of schema.anyOf) { try { validate(a, v, root, path); return; } catch (e) { /* next */ } }
    fail('matches no anyOf alternative');
  }
  if ('const' in schema) { if (JSON.stringify(v) !== JSON.stringify(schema.const)) fail('not the const'); return; }
  if (schema.enum) { if (!schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) fail('not in enum'); return; }
  if (Array.isArray(schema.type)) {
    for (const t of schema.type) { try { validate({ ...schema, type: t }, v, root, path); return; } catch (e) { /* next */ } }
    fail(`none of the types ${schema.type}`);
  }
  switch (schema.type) {
    case 'object':
      if (typeof v !== 'object' || v === null || Array.isArray(v)) fail('not an object');
      for (const r of schema.required || []) if (!(r in v)) fail(`missing ${r}`);
      for (const [k, x] of Object.entries(v)) {
        if (!schema.properties || !(k in schema.properties)) fail(`undeclared ${k}`);
        validate(schema.properties[k], x, root, `${path}.${k}`);
      }
      return;
    case 'array':
      if (!Array.isArray(v)) fail('not an array');
      if (v.length < (schema.minItems ?? 0) || v.length > (schema.maxItems ?? Infinity)) fail('item count');
      v.forEach((x, i) => validate(schema.items, x, root, `${path}[${i}]`));
      return;
    case 'string': {
      if (typeof v !== 'string') fail('not a string');
      const n = [...v].length;
      if (n < (schema.minLength ?? 0) || n > (schema.maxLength ?? Infinity)) fail('length');
      return;
    }
    case 'integer': case 'number':
      if (typeof v !== 'number' || (schema.type === 'integer' && !Number.isInteger(v))) fail('not a ' + schema.type);
      if ('minimum' in schema && v < schema.minimum) fail('below minimum');
      if ('maximum' in schema && v > schema.maximum) fail('above maximum');
      if ('exclusiveMinimum' in schema && v <= schema.exclusiveMinimum) fail('not above exclusiveMinimum');
      if ('exclusiveMaximum' in schema && v >= schema.exclusiveMaximum) fail('not below exclusiveMaximum');
      return;
    case 'boolean': if (typeof v !== 'boolean') fail('not a boolean'); return;
    case 'null': if (v !== null) fail('not null'); return;
    default: return;
  }
}

const S = (maxLength = 8) => ({ type: 'string', maxLength });
const obj = (properties, required = Object.keys(properties)) =>
  ({ type: 'object', properties, required, additionalProperties: false });
const schemas = {
  person: obj({ name: S(), age: { type: 'integer', minimum: 0, maximum: 120 } }),
  nested: obj({ user: obj({ id: { type: 'integer', minimum: 1, maximum: 9999 }, email: S(12) }), ok: { type: 'boolean' } }),
  array_of_enums: obj({ colors: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, minItems: 1, maxItems: 4 } }),
  array_of_objects: obj({ items: { type: 'array', maxItems: 3, items: obj({ sku: S(6), qty: { type: 'integer', minimum: 1, maximum: 99 } }) } }),
  bounded_numbers: obj({ ratio: { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 }, temp: { type: 'number', minimum: -40.5, maximum: 50 } }),
  nullable: obj({ nick: { type: ['string', 'null'], maxLength: 6 }, score: { anyOf: [{ type: 'integer', minimum: 0, maximum: 10 }, { type: 'null' }] } }),
  optional_fields: obj({ a: S(4), b: { type: 'integer', minimum: -5, maximum: 5 }, c: { type: 'boolean' } }, ['b']),
  enum_and_const: obj({ kind: { const: 'event' }, level: { enum: ['low', 'mid', 'high', 1, 2] } }),
  refs: { ...obj({ home: { $ref: '#/$defs/addr' }, work: { anyOf: [{ $ref: '#/$defs/addr' }, { type: 'null' }] } }),
    $defs: { addr: obj({ city: S(6), zip: { type: 'integer', minimum: 10000, maximum: 99999 } }) } },
  matrix: obj({ rows: { type: 'array', maxItems: 2, items: { type: 'array', maxItems: 3, items: { type: 'integer', minimum: 0, maximum: 9 } } } }),
  unicode_strings: obj({ title: { type: 'string', minLength: 1, maxLength: 5 }, tags: { type: 'array', maxItems: 2, items: S(3) } }),
  // Alternatives that begin alike (two objects, integer | number, a string
  // and a string enum) are read side by side until they diverge.
  alike_alternatives: obj({
    v: { anyOf: [obj({ a: S(4) }), obj({ a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'boolean' } }, ['b'])] },
    n: { type: ['integer', 'number'], minimum: -2, maximum: 2 },
    s: { anyOf: [S(3), { enum: ['alpha', 'beta'] }] },
  }),
};

async function main() {
  let seed = 1;
  for (const [name, schema] of Object.entries(schemas)) {
    await check(`json_schema ${name}`, async () => {
      const r = await client.chat.completions.create({
        model, messages, seed: seed++, temperature: 1, max_completion_tokens: 200,
        response_format: { type: 'json_schema', json_schema: { name, schema, strict: true } },
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
      validate(schema, JSON.parse(c.message.content), schema);
    });
  }

  await check('json_object', async () => {
    for (let i = 0; i < 2; i++) {
      const r = await client.chat.completions.create({
        model, messages, seed: 100 + i, max_completion_tokens: 300, response_format: { type: 'json_object' },
      });
      if (r.choices[0].finish_reason !== 'stop') continue;  // an unbounded object may run out of tokens
      const v = JSON.parse(r.choices[0].message.content);
      assert.ok(typeof v === 'object' && v !== null && !Array.isArray(v));
    }
  });

  const tools = [
    { type: 'function', function: { name: 'get_weather', parameters: obj({ city: S(8), unit: { enum: ['c', 'f'] } }) } },
    { type: 'function', function: { name: 'add', parameters: obj({ a: { type: 'integer', minimum: -99, maximum: 99 }, b: { type: 'integer', minimum: -99, maximum: 99 } }) } },
  ];
  await check('tool_choice required always calls a tool with valid arguments', async () => {
    for (let i = 0; i < 4; i++) {
      const r = await client.chat.completions.create({
        model, messages, tools, tool_choice: 'required', seed: 200 + i, max_completion_tokens: 160,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
      assert.equal(c.message.tool_calls.length, 1);
      const call = c.message.tool_calls[0].function;
      const tool = tools.find((t) => t.function.name === call.name);
      assert.ok(tool, call.name);
      validate(tool.function.parameters, JSON.parse(call.arguments), tool.function.parameters);
    }
  });

  await check('a named function is the one called, also streamed', async () => {
    const stream = await client.chat.completions.create({
      model, messages, tools, tool_choice: { type: 'function', function: { name: 'add' } }, seed: 9,
      max_completion_tokens: 160, stream: true,
    });
    let name = '', args = '', finish = null;
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        for (const t of ch.delta.tool_calls || []) {
          if (t.function?.name) name += t.function.name;
          if (t.function?.arguments) args += t.function.arguments;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
      }
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(name, 'add');
    validate(tools[1].function.parameters, JSON.parse(args), tools[1].function.parameters);
  });

  await check('unsupported schema features -> 400 naming them', async () => {
    const bad = [
      [{ type: 'object', properties: { s: { type: 'string', pattern: '(a)\\1' } } }, /pattern.*backreference/],
      [{ type: 'object', properties: { s: { oneOf: [{ type: 'string' }, { type: 'string', maxLength: 3 }] } } }, /oneOf/],
      [{ type: 'object', properties: { s: { type: 'string', format: 'duration' } } }, /format 'duration'/],
    ];
    for (const [schema, name] of bad) {
      await assert.rejects(
        client.chat.completions.create({
          model, messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
        }),
        (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && name.test(e.message) &&
          e.param === 'response_format.json_schema.schema');
    }
    await assert.rejects(
      client.chat.completions.create({ model, messages, response_format: { type: 'yaml' } }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.type' && /yaml/.test(e.message));
    await assert.rejects(
      client.chat.completions.create({
        model, messages, tool_choice: 'required',
        tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'string', format: 'iri' } } } } }],
      }),
      (e) => e instanceof OpenAI.BadRequestError && /format/.test(e.message) && /tools\[0\]/.test(e.param));
  });

  await check('logit_bias +100 makes the token the greedy choice', async () => {
    // " hello" is 40617 in o200k; "hello" is 24912.
    for (const token of [24912, 40617]) {
      const r = await client.completions.create({
        model, prompt: 'Say something.', max_tokens: 3, temperature: 0, logit_bias: { [token]: 100 },
      });
      const one = token === 24912 ? 'hello' : ' hello';
      assert.equal(r.choices[0].text, one.repeat(3));
    }
  });

  console.log('all ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
