// Drives the gateway's Responses API with the official npm openai SDK and
// prints what it saw as one JSON object; TestNpmSDK judges it.
// Env: BASE_URL (…/v1), KEY_A, KEY_B (another token), MODEL.
import OpenAI from 'openai';

const a = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY_A, maxRetries: 0 });
const b = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.KEY_B, maxRetries: 0 });
const model = process.env.MODEL;
const out = {};
const status = async (p) => { try { await p; return 200; } catch (e) { return e.status ?? String(e); } };

const first = await a.responses.create({ model, instructions: 'Be brief.', input: 'Hi' });
out.first = { id: first.id, status: first.status, text: first.output_text, usage: first.usage };

const stream = await a.responses.create({ model, input: 'And again?', previous_response_id: first.id, stream: true });
out.events = [];
let deltas = '';
for await (const ev of stream) {
  out.events.push(ev.type);
  if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  if (ev.type === 'response.completed') out.second = { id: ev.response.id, text: ev.response.output.flatMap((o) => o.content ?? []).map((c) => c.text).join(''), previous: ev.response.previous_response_id };
}
out.deltas = deltas;

const got = await a.responses.retrieve(out.second.id);
out.retrieved = got.output_text;
const items = await a.responses.inputItems.list(out.second.id, { order: 'asc' });
out.inputItems = items.data.map((it) => `${it.role}: ${it.content[0].text}`);
out.otherTokenRetrieve = await status(b.responses.retrieve(out.second.id));
out.unsupportedTool = await status(a.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] }));
out.deleted = await status(a.responses.delete(out.second.id));
out.retrieveDeleted = await status(a.responses.retrieve(out.second.id));
console.log(JSON.stringify(out));
