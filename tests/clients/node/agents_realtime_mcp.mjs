// @openai/agents-realtime's RealtimeSession (unmodified) over WebSocket with a hosted MCP tool
// (agents-core's `hostedMcpTool`): the SDK names the MCP server in its session.update, the server
// lists it and runs the calls; with `approval`, the SDK's `tool_approval_requested` is approved
// through `session.approve`, which sends the mcp_approval_response. The SDK's automatic
// response.create after an MCP call is off (this server answers in the call's own response).
//
//   node agents_realtime_mcp.mjs CONFIG.json
//
// CONFIG: {url, apiKey, mcpUrl, approval, question, events (where every raw server event goes, one
// JSON a line)}. Prints what it observed as one JSON object.
import { readFileSync, writeFileSync } from 'node:fs';
import { hostedMcpTool } from '@openai/agents-core';
import { RealtimeAgent, RealtimeSession } from '@openai/agents-realtime';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const events = [];
const out = { errors: [], tools: [], approvals: [], calls: [], answers: [] };

const everything = hostedMcpTool({
  serverLabel: 'everything',
  serverUrl: config.mcpUrl,
  allowedTools: ['echo'],
  requireApproval: config.approval ? 'always' : 'never',
});
const agent = new RealtimeAgent({ name: 'Assistant', instructions: 'Be brief.', tools: [everything] });
// This server answers from an MCP call's output in the same response (docs/tools.md); by default the
// SDK asks for one more response after each MCP call, which would make the agent answer twice.
const session = new RealtimeSession(agent, {
  transport: 'websocket',
  model: 'gpt-realtime',
  config: { outputModalities: ['text'] },
  automaticallyTriggerResponseForMcpToolCalls: false,
});
session.on('error', (e) => out.errors.push(String(e?.error?.error?.message ?? e?.error?.message ?? e?.error ?? e)));
session.on('mcp_tools_changed', (tools) => (out.tools = tools.map((t) => t.name)));
session.on('tool_approval_requested', (_context, _agent, request) => {
  out.approvals.push(request.type);
  session.approve(request.approvalItem);
});
session.on('mcp_tool_call_completed', (_context, _agent, call) => out.calls.push({ name: call.name, arguments: call.arguments, output: call.output }));
session.on('agent_end', (_context, _agent, text) => text && out.answers.push(text));

function until(predicate, timeoutMs, what) {
  return new Promise((resolve, reject) => {
    const start = Date.now();
    const poll = setInterval(() => {
      if (predicate()) {
        clearInterval(poll);
        resolve();
      } else if (Date.now() - start > timeoutMs) {
        clearInterval(poll);
        reject(new Error(`no ${what} within ${timeoutMs} ms`));
      }
    }, 20);
  });
}

try {
  await session.connect({ apiKey: config.apiKey, url: config.url });
  session.transport.on('*', (e) => events.push(e));
  await until(() => out.tools.length > 0, 15000, 'MCP tools listed');
  session.sendMessage(config.question);
  await until(() => out.calls.length > 0 && out.answers.length > 0, 15000, 'MCP call and answer');
  await new Promise((r) => setTimeout(r, 1000)); // whatever the SDK does after the call (a response.create of its own)
} catch (err) {
  out.failure = String(err?.stack ?? err);
} finally {
  session.close();
  writeFileSync(config.events, events.map((e) => JSON.stringify(e) + '\n').join(''));
  console.log(JSON.stringify(out));
}
