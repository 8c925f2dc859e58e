// Writes corpus.json: JSON Schemas as clients write them, for
// schema_corpus_test.js. The zod ones come from z.toJSONSchema (zod, pinned in
// tools/node/package.json); the pydantic ones are written out in
// pydantic_style.json as pydantic v2's model_json_schema() emits them
// (pydantic itself is a Python package). Each entry says whether structured
// outputs enforce it or refuse it (and the keyword the refusal names).
// Usage: NODE_PATH=<node_modules> node generate_corpus.js
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const { z } = require('zod');

const enforced = (name, schema) => ({ name, expect: 'enforced', zod: schema });
const refused = (name, keyword, schema) => ({ name, expect: 'refused', keyword, zod: schema });

const Category = z.object({
  name: z.string().max(12),
  get children() { return z.array(Category).max(2); },
});

const zodCases = [
  enforced('zod_user_profile', z.object({
    name: z.string().min(1).max(20), email: z.email(), age: z.number().int().min(0).max(150).optional(),
  })),
  enforced('zod_signup', z.object({
    username: z.string().regex(/^[a-z0-9_]{3,16}$/), password: z.string().min(8).max(20),
    website: z.url().optional(),
  })),
  enforced('zod_event', z.object({
    title: z.string().max(30), start: z.iso.datetime(), end: z.iso.datetime({ offset: true }),
    attendees: z.array(z.email().max(30)).max(2),
  })),
  enforced('zod_uuid_refs', z.object({ id: z.uuid(), parent: z.uuid().nullable() })),
  enforced('zod_date_range', z.object({ from: z.iso.date(), to: z.iso.date() })),
  enforced('zod_network', z.object({
    host: z.hostname().max(40), v4: z.ipv4(), v6: z.ipv6(), port: z.number().int().min(1).max(65535),
  })),
  enforced('zod_record_scores', z.record(z.string().max(12), z.number())),
  enforced('zod_record_enum_keys', z.record(z.enum(['low', 'mid', 'high']), z.boolean())),
  enforced('zod_tuple_point', z.tuple([z.number(), z.number()])),
  enforced('zod_tuple_with_rest', z.object({ row: z.tuple([z.string().max(8)], z.number().int()) })),
  enforced('zod_discriminated_shapes', z.discriminatedUnion('kind', [
    z.object({ kind: z.literal('circle'), radius: z.number().positive() }),
    z.object({ kind: z.literal('rect'), w: z.number(), h: z.number() }),
  ])),
  enforced('zod_union_scalar', z.object({ value: z.union([z.string().max(10), z.number(), z.boolean()]) })),
  enforced('zod_multiple_of', z.object({
    quantity: z.number().int().multipleOf(5).min(0).max(100), step: z.number().int().multipleOf(3),
  })),
  enforced('zod_enums_and_literals', z.object({
    status: z.enum(['draft', 'published']), version: z.literal(2), flag: z.literal(true),
  })),
  enforced('zod_nested_address', z.object({
    address: z.object({
      street: z.string().max(30), city: z.string().max(20), zip: z.string().regex(/^\d{5}$/),
      country: z.string().length(2),
    }),
  })),
  enforced('zod_nullable_optional', z.object({ nick: z.string().max(12).nullable(), bio: z.string().max(50).optional() })),
  enforced('zod_array_bounds', z.object({ tags: z.array(z.string().max(10)).min(1).max(5) })),
  enforced('zod_recursive_category', Category),
  enforced('zod_order', z.object({
    items: z.array(z.object({ sku: z.string().regex(/^[A-Z]{3}-\d{4}$/), qty: z.number().int().positive() })).max(3),
    total: z.number().nonnegative(),
  })),
  enforced('zod_contact_method', z.object({
    method: z.union([
      z.object({ type: z.literal('email'), address: z.email() }),
      z.object({ type: z.literal('phone'), number: z.string().regex(/^\+?[0-9]{7,15}$/) }),
    ]),
  })),
  enforced('zod_catchall', z.object({ a: z.string().max(8) }).catchall(z.number())),
  enforced('zod_starts_ends_includes', z.object({
    ref: z.string().startsWith('INV-').endsWith('-Z').max(16), note: z.string().includes('@').max(20),
  })),
  enforced('zod_fixed_uuid_pair', z.array(z.uuid()).length(2)),
  enforced('zod_bounded_numbers', z.object({
    ratio: z.number().gt(0).lt(1), temp: z.number().min(-40).max(60), level: z.number().int().gte(1).lte(9),
  })),
  enforced('zod_time_of_day', z.object({ at: z.iso.time() })),
  enforced('zod_intersection_of_unions', z.intersection(
    z.union([z.object({ a: z.string() }), z.object({ b: z.string() })]), z.object({ c: z.number() }))),
  refused('zod_money_cents', 'multipleOf', z.object({ amount: z.number().multipleOf(0.01) })),
  refused('zod_word_boundary', 'pattern', z.object({ word: z.string().regex(/\bcat\b/) })),
  refused('zod_nanoid', 'format', z.object({ id: z.nanoid() })),
  refused('zod_base64', 'contentEncoding', z.object({ blob: z.base64() })),
];

function main() {
  const dir = __dirname;
  const corpus = [];
  for (const c of zodCases) {
    corpus.push({ name: c.name, origin: 'zod', expect: c.expect, keyword: c.keyword, schema: z.toJSONSchema(c.zod) });
  }
  for (const c of JSON.parse(fs.readFileSync(path.join(dir, 'pydantic_style.json'), 'utf8'))) {
    corpus.push({ name: c.name, origin: 'pydantic', expect: c.expect, keyword: c.keyword, schema: c.schema });
  }
  fs.writeFileSync(path.join(dir, 'corpus.json'), JSON.stringify(corpus, null, 1) + '\n');
  console.log(`wrote ${corpus.length} schemas`);
}

main();
