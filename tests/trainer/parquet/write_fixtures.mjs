// Writes the Parquet fixtures of tests/trainer/test_parquet.cpp: rows of verl's gsm8k schema
// (verl examples/data_preprocess/gsm8k.py: data_source, prompt as a list of {role, content}
// structs, ability, reward_model {style, ground_truth}, extra_info {split, index, answer,
// question}) through two real Parquet writers, and expected.jsonl, the same rows as JSON.
//   cd tests/trainer/parquet && npm ci && node write_fixtures.mjs
// - hyparquet-writer: pyarrow's layout (a LIST group holding "list" / "element"), data pages v2,
//   dictionary encoding where it pays, SNAPPY, ZSTD (via @bokuweb/zstd-wasm) and uncompressed,
//   two row groups; one more file with a DELTA_BINARY_PACKED column (not supported: FormatError).
// - @dsnp/parquetjs: data pages v1, PLAIN values, SNAPPY and GZIP.
// Then hyparquet (a third, independent implementation) reads every file back and must find the
// rows of expected.jsonl.
import { readFileSync, writeFileSync } from 'node:fs'
import { gunzipSync, gzipSync } from 'node:zlib'
import { parquetWriteBuffer } from 'hyparquet-writer'
import { parquetReadObjects } from 'hyparquet'
import parquetjs from '@dsnp/parquetjs'
import { init as zstdInit, compress as zstdCompress, decompress as zstdDecompress } from '@bokuweb/zstd-wasm'

const instruction = 'Let\'s think step by step and output the final answer after "####".'
const problems = [
  ['Tom has 3 apples and buys 5 more. How many apples does he have?', 'Tom has 3 + 5 = <<3+5=8>>8 apples.\n#### 8', '8'],
  ['A box holds 12 eggs. How many eggs are in 4 boxes?', '4 * 12 = <<4*12=48>>48 eggs.\n#### 48', '48'],
  ['Mia reads 20 pages a day. How many days does a 140-page book take her?', '140 / 20 = <<140/20=7>>7 days.\n#### 7', '7'],
  ['A shirt costs $15 and is 20% off. What does it cost now?', '15 * 0.8 = <<15*0.8=12>>12 dollars.\n#### 12', '12'],
  ['There are 9 birds; 4 fly away and 6 arrive. How many birds are there?', '9 - 4 + 6 = <<9-4+6=11>>11.\n#### 11', '11'],
  ['Ünïcode: a café sells 7 crêpes an hour for 3 hours. How many crêpes?', '7 * 3 = <<7*3=21>>21.\n#### 21', '21'],
  ['Sam has 100 marbles and gives half away. How many are left?', '100 / 2 = <<100/2=50>>50.\n#### 50', '50'],
]
const rows = problems.map(([question, answer, solution], index) => ({
  data_source: 'openai/gsm8k',
  // one row with a system message too: a list of two structs
  prompt: index === 2
    ? [{ content: 'You are a careful tutor.', role: 'system' }, { content: question + ' ' + instruction, role: 'user' }]
    : [{ content: question + ' ' + instruction, role: 'user' }],
  ability: 'math',
  reward_model: { ground_truth: solution, style: 'rule' },
  extra_info: { answer, index, question, split: 'train' },
}))
writeFileSync('expected.jsonl', rows.map(r => JSON.stringify(r)).join('\n') + '\n')

// pyarrow's schema of this table (datasets.Dataset.to_parquet)
const str = (name) => ({ name, type: 'BYTE_ARRAY', repetition_type: 'OPTIONAL', converted_type: 'UTF8', logical_type: { type: 'STRING' } })
const schema = [
  { name: 'schema', num_children: 5 },
  str('data_source'),
  { name: 'prompt', repetition_type: 'OPTIONAL', num_children: 1, converted_type: 'LIST', logical_type: { type: 'LIST' } },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
  str('content'),
  str('role'),
  str('ability'),
  { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
  str('ground_truth'),
  str('style'),
  { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 4 },
  str('answer'),
  { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' },
  str('question'),
  str('split'),
]
const columns = ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info']
// hyparquet-writer takes INT64 values as BigInt
const forWriter = (name, v) => (name === 'extra_info' ? { ...v, index: BigInt(v.index) } : v)
const columnData = (extra = {}) =>
  columns.map(name => ({ name, data: rows.map(r => forWriter(name, r[name])), ...(extra[name] || {}) }))

await zstdInit()
const compressors = {
  ZSTD: (bytes) => zstdCompress(bytes, 10),
  GZIP: (bytes) => new Uint8Array(gzipSync(bytes)),
}
const readCompressors = {
  ZSTD: (bytes) => zstdDecompress(bytes),
  GZIP: (bytes) => new Uint8Array(gunzipSync(bytes)),
}
const written = []
const normalize = (v) => JSON.parse(JSON.stringify(v, (k, x) => (typeof x === 'bigint' ? Number(x) : x)))
const hyparquetFile = (file, codec, extra) => {
  const buffer = parquetWriteBuffer({ columnData: columnData(extra), schema, codec, compressors, rowGroupSize: 4 })
  writeFileSync(file, new Uint8Array(buffer))
  written.push(file)
}
hyparquetFile('gsm8k_v2_snappy.parquet', 'SNAPPY')
hyparquetFile('gsm8k_v2_zstd.parquet', 'ZSTD')
hyparquetFile('gsm8k_v2_uncompressed.parquet', 'UNCOMPRESSED')
// extra_info.index with an encoding the reader does not support: reading that column fails
// naming the file and the column, the other columns read
const deltaSchema = [...schema.slice(0, 11), { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 1 },
  { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' }]
writeFileSync('delta_index.parquet', new Uint8Array(parquetWriteBuffer({
  columnData: [...columnData().slice(0, 4),
    { name: 'extra_info', data: rows.map(r => ({ index: BigInt(r.extra_info.index) })), encoding: 'DELTA_BINARY_PACKED' }],
  schema: deltaSchema, codec: 'SNAPPY',
})))

// Nesting at its edges (not in verl's files, but in the format): null and empty lists, null
// list elements, null struct fields, a list of lists, null integers, across two row groups.
const edgeRows = [
  { id: 0, prompt: null, matrix: [[1, 2], [3]], reward_model: { ground_truth: '1', style: null } },
  { id: 1, prompt: [], matrix: [], reward_model: null },
  { id: 2, prompt: [null, { content: 'hi', role: null }], matrix: [[], null, [null, 4]],
    reward_model: { ground_truth: null, style: 'rule' } },
  { id: null, prompt: [{ content: 'a', role: 'user' }, { content: 'b', role: 'assistant' }], matrix: null,
    reward_model: { ground_truth: 'x', style: 'rule' } },
  { id: 4, prompt: [{ content: '', role: 'user' }], matrix: [[5]], reward_model: { ground_truth: '', style: '' } },
]
writeFileSync('expected_edges.jsonl', edgeRows.map(r => JSON.stringify(r)).join('\n') + '\n')
const listOf = (name, children) => [
  { name, repetition_type: 'OPTIONAL', num_children: 1, converted_type: 'LIST', logical_type: { type: 'LIST' } },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 }, ...children]
const edgeSchema = [
  { name: 'schema', num_children: 4 },
  { name: 'id', type: 'INT32', repetition_type: 'OPTIONAL' },
  ...schema.slice(2, 7),
  ...listOf('matrix', listOf('element', [{ name: 'element', type: 'INT32', repetition_type: 'OPTIONAL' }])),
  ...schema.slice(8, 11),
]
writeFileSync('nested_edges.parquet', new Uint8Array(parquetWriteBuffer({
  columnData: ['id', 'prompt', 'matrix', 'reward_model'].map(name => ({ name, data: edgeRows.map(r => r[name]) })),
  schema: edgeSchema, codec: 'SNAPPY', rowGroupSize: 2,
})))
{
  const b = readFileSync('nested_edges.parquet')
  const back = normalize(await parquetReadObjects({ file: b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) }))
  if (JSON.stringify(back) !== JSON.stringify(edgeRows)) {
    console.error('nested_edges.parquet reads back as', JSON.stringify(back))
    process.exit(1)
  }
  console.log('wrote nested_edges.parquet (read back by hyparquet: the expected rows)')
}

// parquetjs: the same table, data pages v1 with PLAIN values
const { ParquetSchema, ParquetWriter } = parquetjs
const parquetjsFile = async (file, compression) => {
  const s = (extra = {}) => ({ type: 'UTF8', optional: true, compression, ...extra })
  const pjsSchema = new ParquetSchema({
    data_source: s(),
    prompt: { type: 'LIST', optional: true, fields: { list: { repeated: true, fields: { element: { optional: true, fields: { content: s(), role: s() } } } } } },
    ability: s(),
    reward_model: { optional: true, fields: { ground_truth: s(), style: s() } },
    extra_info: { optional: true, fields: { answer: s(), index: { type: 'INT64', optional: true, compression }, question: s(), split: s() } },
  })
  const writer = await ParquetWriter.openFile(pjsSchema, file, { useDataPageV2: false, rowGroupSize: 4 })
  for (const r of rows)
    await writer.appendRow({ ...r, prompt: { list: r.prompt.map(element => ({ element })) } })
  await writer.close()
  written.push(file)
}
await parquetjsFile('gsm8k_v1_snappy.parquet', 'SNAPPY')
await parquetjsFile('gsm8k_v1_gzip.parquet', 'GZIP')

// Cross-check with hyparquet: every file holds exactly the expected rows.
for (const file of written) {
  const b = readFileSync(file)
  const file_ = b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)
  const back = normalize(await parquetReadObjects({ file: file_, compressors: readCompressors }))
  if (JSON.stringify(back) !== JSON.stringify(rows)) {
    console.error(file, 'reads back as', JSON.stringify(back[0]))
    process.exit(1)
  }
  console.log('wrote', file, '(read back by hyparquet: the expected rows)')
}
