// The official `openai` Node SDK (tools/npm/package-lock.json) against `toolloop serve --openai`
// (run by serve_openai.rs).
//
// usage: node openai_client.mjs NODE_MODULES BASE_URL TOKEN AGENT_MODEL GATEWAY_MODEL
//
// Runs the agent as a model, whole and streamed, then the gateway over client-side tool calls
// until it answers, whole and streamed. Prints one JSON line of what it saw; a failure throws.

import { createRequire } from "node:module";
import path from "node:path";

const [modules, baseURL, apiKey, agentModel, gatewayModel] = process.argv.slice(2);
const require = createRequire(path.join(modules, "noop.js"));
const { OpenAI } = require("openai");
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const seen = {};

const whole = await client.chat.completions.create({
  model: agentModel,
  messages: [{ role: "user", content: "Look around." }],
});
seen.agent_whole = whole.choices[0].message.content;

let text = "";
const stream = await client.chat.completions.create({
  model: agentModel,
  messages: [{ role: "user", content: "Look around." }],
  stream: true,
});
for await (const chunk of stream) {
  for (const choice of chunk.choices) text += choice.delta?.content ?? "";
}
seen.agent_streamed = text;

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city.",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  },
];

async function gateway(streamed) {
  const messages = [{ role: "user", content: "The weather in Paris?" }];
  const rounds = [];
  for (let i = 0; i < 10; i++) {
    let calls = [];
    let answer = "";
    let finish = null;
    if (streamed) {
      const s = await client.chat.completions.create({ model: gatewayModel, messages, tools, stream: true });
      for await (const chunk of s) {
        for (const choice of chunk.choices) {
          answer += choice.delta?.content ?? "";
          for (const d of choice.delta?.tool_calls ?? []) {
            calls[d.index] ??= { id: null, name: null, arguments: "" };
            if (d.id) calls[d.index].id = d.id;
            if (d.function?.name) calls[d.index].name = d.function.name;
            if (d.function?.arguments) calls[d.index].arguments += d.function.arguments;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    } else {
      const done = await client.chat.completions.create({ model: gatewayModel, messages, tools });
      const m = done.choices[0].message;
      answer = m.content ?? "";
      finish = done.choices[0].finish_reason;
      calls = (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
    }
    if (calls.length === 0) {
      if (finish !== "stop") throw new Error(`finish ${finish}`);
      return { rounds, answer };
    }
    if (finish !== "tool_calls") throw new Error(`finish ${finish}`);
    for (const c of calls) JSON.parse(c.arguments);
    rounds.push(calls.map((c) => c.name));
    messages.push({
      role: "assistant",
      content: null,
      tool_calls: calls.map((c) => ({ id: c.id, type: "function", function: { name: c.name, arguments: c.arguments } })),
    });
    for (const c of calls) messages.push({ role: "tool", tool_call_id: c.id, content: "sunny" });
  }
  throw new Error("the gateway never answered");
}

seen.gateway_whole = await gateway(false);
seen.gateway_streamed = await gateway(true);
console.log(JSON.stringify(seen));
