// @openai/agents-realtime's RealtimeSession (unmodified) against the CPU agent's own thinker: a
// tool() with a zod schema, called by the model, run by the SDK, and its output answered aloud by
// the follow-up response the SDK asks for itself.
//
//   node agents_tools.mjs CONFIG.json
//
// CONFIG: {url, apiKey, question, events (where every raw server event goes, one JSON a line)}.
// Prints what it observed as one JSON object.
import { readFileSync, writeFileSync } from 'node:fs';
import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { z } from 'zod';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const events = [];
const out = { toolCalls: [], errors: [] };

const getWeather = tool({
  name: 'get_weather',
  description: 'Get the current weather in a city.',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    out.toolCalls.push({ city });
    return JSON.stringify({ city, sky: 'snowing', celsius: -3 });
  },
});
const agent = new RealtimeAgent({ name: 'Assistant', instructions: 'You are a helpful assistant. Always reply in English with one short, simple sentence.', tools: [getWeather] });
const session = new RealtimeSession(agent, { transport: 'websocket', model: 'gpt-realtime' });
session.on('error', (e) => out.errors.push(String(e?.error?.error?.message ?? e?.error ?? e)));

function next(name, timeoutMs = 90000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${name} within ${timeoutMs} ms`)), timeoutMs);
    session.once(name, (...args) => {
      clearTimeout(timer);
      resolve(args);
    });
  });
}

try {
  await session.connect({ apiKey: config.apiKey, url: config.url });
  session.transport.on('*', (e) => events.push(e));
  const toolEnd = next('agent_tool_end');
  session.sendMessage(config.question);
  await toolEnd;
  let text = '';
  while (!text) [, , text] = await next('agent_end'); // (the call's own response ends with no text)
  out.toolAnswer = text; // the follow-up's answer, asked for by the SDK after it sent the output
} catch (err) {
  out.failure = String(err?.stack ?? err);
} finally {
  session.close();
  writeFileSync(config.events, events.map((e) => JSON.stringify(e) + '\n').join(''));
  console.log(JSON.stringify(out));
}
