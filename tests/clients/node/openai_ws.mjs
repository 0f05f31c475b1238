// The openai JS SDK's OpenAIRealtimeWS (unmodified) against the server. It always connects with
// wss:// (its buildRealtimeURL forces it), so the server runs TLS and this process trusts the test
// CA through NODE_EXTRA_CA_CERTS. A session.update, a text turn and a server-VAD audio turn.
//
//   NODE_EXTRA_CA_CERTS=ca.pem node openai_ws.mjs CONFIG.json
//
// CONFIG: {baseURL (https://.../v1), apiKey, speech (raw pcm16 24 kHz), events (raw server events
// out, one JSON a line)}. Prints what it observed as one JSON object.
import { readFileSync, writeFileSync } from 'node:fs';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const speech = readFileSync(config.speech);
const silence = Buffer.alloc(48000);
const events = [];
const out = { errors: [] };

const client = new OpenAI({ apiKey: config.apiKey, baseURL: config.baseURL });
const rt = new OpenAIRealtimeWS({ model: 'gpt-realtime' }, client);
rt.on('event', (e) => events.push(e));
rt.on('error', (e) => out.errors.push(String(e?.message ?? e)));

function next(type, timeoutMs = 15000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${type} within ${timeoutMs} ms`)), timeoutMs);
    rt.once(type, (e) => {
      clearTimeout(timer);
      resolve(e);
    });
  });
}

try {
  await new Promise((resolve, reject) => {
    rt.socket.once('open', resolve);
    rt.socket.once('error', reject);
  });
  out.url = String(rt.url);
  await next('session.created');
  rt.send({ type: 'session.update', session: { type: 'realtime', instructions: 'Be brief.', output_modalities: ['audio'] } });
  await next('session.updated');

  rt.send({ type: 'conversation.item.create', item: { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello there!' }] } });
  rt.send({ type: 'response.create' });
  out.text = (await next('response.done')).response;

  const audio = Buffer.concat([silence, speech, silence]);
  for (let i = 0; i < audio.length; i += 960) {
    rt.send({ type: 'input_audio_buffer.append', audio: audio.subarray(i, i + 960).toString('base64') });
  }
  out.committed = (await next('input_audio_buffer.committed')).item_id;
  out.audio = (await next('response.done')).response;
} catch (err) {
  out.failure = String(err?.stack ?? err);
} finally {
  rt.close();
  writeFileSync(config.events, events.map((e) => JSON.stringify(e) + '\n').join(''));
  console.log(JSON.stringify(out));
}
