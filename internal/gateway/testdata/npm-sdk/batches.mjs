// Drives the Files and Batch APIs with the official npm openai SDK and
// prints what it saw as one JSON object; TestNpmSDKBatches
// (internal/dataplanetest) judges it.
// Env: BASE_URL (…/v1), KEY_A, KEY_B (another token), MODEL, LINES.
import OpenAI, { toFile } from 'openai';

const a = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY_A, maxRetries: 2 });
const b = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY_B, maxRetries: 0 });
const model = process.env.MODEL;
const n = Number(process.env.LINES);
const out = {};
const status = async (p) => { try { await p; return 200; } catch (e) { return e.status ?? String(e); } };

const lines = [];
for (let i = 0; i < n; i++) {
  lines.push(JSON.stringify({ custom_id: `req-${i}`, method: 'POST', url: '/v1/chat/completions',
    body: { model, max_tokens: 8, messages: [{ role: 'user', content: `line ${i}` }] } }));
}
const file = await a.files.create({ file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'input.jsonl'), purpose: 'batch' });
out.file = { id: file.id, purpose: file.purpose, bytes: file.bytes };

const created = await a.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { run: 'npm' } });
out.created = { status: created.status, total: created.request_counts.total, metadata: created.metadata };
let batch = created;
const deadline = Date.now() + 60000;
while (!['completed', 'failed', 'expired', 'cancelled'].includes(batch.status) && Date.now() < deadline) {
  await new Promise((r) => setTimeout(r, 100));
  batch = await a.batches.retrieve(created.id);
}
out.final = { status: batch.status, counts: batch.request_counts, output: batch.output_file_id, error: batch.error_file_id };

const content = await a.files.content(batch.output_file_id);
const results = (await content.text()).trim().split('\n').map((l) => JSON.parse(l));
out.results = results.map((r) => ({ custom_id: r.custom_id, status: r.response?.status_code, content: r.response?.body?.choices?.[0]?.message?.content ?? '' }));

const page = await a.batches.list({ limit: 10 });
out.listed = page.data.map((x) => x.id).includes(created.id);
out.otherTokenRetrieve = await status(b.batches.retrieve(created.id));
out.otherTokenContent = await status(b.files.content(batch.output_file_id));
out.deleted = (await a.files.delete(file.id)).deleted;
console.log(JSON.stringify(out));
