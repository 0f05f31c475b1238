// @openai/agents-realtime's RealtimeSession (unmodified) over WebSocket against the server: a text
// message, streamed audio turns with server VAD, a mid-turn `sendAudio(..., {commit: true})`, and a
// tool with a required parameter (a zod schema) that the SDK runs itself before asking for the
// follow-up answer. With `toolOnly` (the CPU agent's real thinker) only the tool, asked `question`.
//
//   node agents_realtime.mjs CONFIG.json
//
// CONFIG: {url, apiKey, speech (raw pcm16 24 kHz), events (where every raw server event goes, one
// JSON a line, for the test to validate against the official SDK's models), toolOnly, question}.
// Prints what each step observed as one JSON object.
import { readFileSync, writeFileSync } from 'node:fs';
import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { z } from 'zod';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const speech = config.speech ? new Int16Array(new Uint8Array(readFileSync(config.speech)).buffer) : new Int16Array(0);
const waitMs = config.toolOnly ? 90000 : 15000; // a real thinker on two cores is slower than the stand-in
const silence = new Int16Array(24000);
const events = [];
const out = { toolCalls: [], errors: [] };

const getWeather = tool({
  name: 'get_weather',
  description: 'Get the current weather in a city',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    out.toolCalls.push({ city });
    return `sunny in ${city}`;
  },
});
const agent = new RealtimeAgent({ name: 'Assistant', instructions: 'You are a helpful voice assistant.', tools: [getWeather] });
const session = new RealtimeSession(agent, { transport: 'websocket', model: 'gpt-realtime' });
session.on('error', (e) => out.errors.push(String(e?.error?.error?.message ?? e?.error ?? e)));

function next(name, predicate = () => true, timeoutMs = waitMs) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${name} within ${timeoutMs} ms`)), timeoutMs);
    const on = (...args) => {
      if (!predicate(...args)) return;
      clearTimeout(timer);
      session.off(name, on);
      resolve(args);
    };
    session.on(name, on);
  });
}

// the answer of the next response that says something: its done event's output text
async function answer() {
  let text = '';
  while (!text) [, , text] = await next('agent_end'); // (a response that only calls a tool has none)
  return text;
}

function transcriptOf(itemId) {
  const e = events.find((e) => e.type === 'conversation.item.input_audio_transcription.completed' && e.item_id === itemId);
  return e ? e.transcript : null;
}

async function send(pcm, options = {}) {
  for (let i = 0; i < pcm.length; i += 480) {
    const chunk = pcm.slice(i, i + 480);
    session.sendAudio(chunk.buffer, options.commit && i + 480 >= pcm.length ? { commit: true } : {});
    await new Promise((r) => setImmediate(r));
  }
}

function concat(...parts) {
  const all = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return all;
}

// a tool with a required parameter: called by the model, run by the SDK, answered automatically
async function askTool(question) {
  const toolEnd = next('agent_tool_end');
  session.sendMessage(question);
  await toolEnd;
  out.toolAnswer = await answer();
}

async function scenario() {
  // 1. a text message
  session.sendMessage('Hello there, how are you?');
  out.message = await answer();

  // 2. streamed audio turns, server VAD
  out.turns = [];
  for (let i = 0; i < 2; i++) {
    const committed = next('transport_event', (e) => e.type === 'input_audio_buffer.committed');
    await send(concat(silence, speech, silence));
    const [e] = await committed;
    out.turns.push({ answer: await answer(), item: e.item_id });
  }

  // 3. a mid-turn commit (sendAudio(..., {commit: true}) while server VAD is on), then more turns
  const midCommitted = next('transport_event', (e) => e.type === 'input_audio_buffer.committed');
  await send(concat(silence, speech.slice(0, speech.length / 2)), { commit: true });
  out.midCommit = (await midCommitted)[0].item_id;
  await send(silence);
  for (let i = 0; i < 2; i++) {
    const committed = next('transport_event', (e) => e.type === 'input_audio_buffer.committed');
    await send(concat(silence, speech, silence));
    const [e] = await committed;
    out.turns.push({ answer: await answer(), item: e.item_id });
  }

  // 4. the tool
  await askTool('What is the weather like in Paris today?');
  await new Promise((r) => setTimeout(r, 300)); // the last transcripts
  out.transcripts = Object.fromEntries([out.midCommit, ...out.turns.map((t) => t.item)].map((id) => [id, transcriptOf(id)]));
}

try {
  await session.connect({ apiKey: config.apiKey, url: config.url });
  session.transport.on('*', (e) => events.push(e));
  if (config.toolOnly) await askTool(config.question);
  else await scenario();
} catch (err) {
  out.failure = String(err?.stack ?? err);
} finally {
  session.close();
  writeFileSync(config.events, events.map((e) => JSON.stringify(e) + '\n').join(''));
  console.log(JSON.stringify(out));
}
