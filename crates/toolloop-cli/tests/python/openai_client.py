"""The official `openai` Python SDK against `toolloop serve --openai` (run by serve_clients.rs).

usage: openai_client.py BASE_URL TOKEN AGENT_MODEL GATEWAY_MODEL

Runs the agent as a model (Chat Completions whole and streamed, Responses), then the gateway
over several rounds of client-side tool calls, whole and streamed, in both APIs, answering
every call once.
Prints one JSON line of what it saw; any failure raises (exit code 1).
"""

import json
import sys

import openai

base, token, agent_model, gateway_model = sys.argv[1:5]
client = openai.OpenAI(base_url=base, api_key=token, max_retries=0, timeout=60)
seen = {}

models = [m.id for m in client.models.list()]
seen["models"] = models

done = client.chat.completions.create(
    model=agent_model, messages=[{"role": "user", "content": "Look around."}]
)
seen["agent_whole"] = done.choices[0].message.content
seen["agent_whole_finish"] = done.choices[0].finish_reason

text = ""
finishes = []
for chunk in client.chat.completions.create(
    model=agent_model,
    messages=[{"role": "user", "content": "Look around."}],
    stream=True,
):
    for choice in chunk.choices:
        if choice.delta.content:
            text += choice.delta.content
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
seen["agent_streamed"] = text
seen["agent_streamed_finish"] = finishes

response = client.responses.create(model=agent_model, input="Look around.")
seen["agent_responses"] = response.output_text

deltas = ""
completed = None
for event in client.responses.create(model=agent_model, input="Look around.", stream=True):
    if event.type == "response.output_text.delta":
        deltas += event.delta
    elif event.type == "response.completed":
        completed = event.response.output_text
seen["agent_responses_streamed"] = [deltas, completed]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string"}},
                "required": ["zone"],
            },
        },
    },
]


def gateway(stream):
    messages = [{"role": "user", "content": "Weather and time, please."}]
    rounds = []
    for _ in range(10):
        if stream:
            calls = {}
            text = ""
            finish = None
            for chunk in client.chat.completions.create(
                model=gateway_model, messages=messages, tools=TOOLS, stream=True
            ):
                for choice in chunk.choices:
                    delta = choice.delta
                    if delta.content:
                        text += delta.content
                    for d in delta.tool_calls or []:
                        call = calls.setdefault(
                            d.index, {"id": None, "name": None, "arguments": ""}
                        )
                        if d.id:
                            call["id"] = d.id
                        if d.function and d.function.name:
                            call["name"] = d.function.name
                        if d.function and d.function.arguments:
                            call["arguments"] += d.function.arguments
                    if choice.finish_reason:
                        finish = choice.finish_reason
            calls = [calls[i] for i in sorted(calls)]
        else:
            done = client.chat.completions.create(
                model=gateway_model, messages=messages, tools=TOOLS
            )
            message = done.choices[0].message
            text = message.content or ""
            finish = done.choices[0].finish_reason
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in message.tool_calls or []
            ]
        if not calls:
            assert finish == "stop", finish
            return {"rounds": rounds, "answer": text}
        assert finish == "tool_calls", finish
        for c in calls:
            assert c["id"] and c["name"] in ("get_weather", "get_time"), c
            assert isinstance(json.loads(c["arguments"]), dict), c
        rounds.append([c["name"] for c in calls])
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ],
            }
        )
        for c in calls:
            messages.append(
                {"role": "tool", "tool_call_id": c["id"], "content": "sunny at noon"}
            )
    raise AssertionError("the gateway never answered")


seen["gateway_whole"] = gateway(False)
seen["gateway_streamed"] = gateway(True)

RESPONSES_TOOLS = [
    {"type": "function", **t["function"]} for t in TOOLS
]


def gateway_responses(stream):
    """The gateway through the Responses API: function_call items out, their outputs back."""
    items = [{"role": "user", "content": "Weather and time, please."}]
    rounds = []
    for _ in range(10):
        if stream:
            response = None
            kinds = []
            for event in client.responses.create(
                model=gateway_model, input=items, tools=RESPONSES_TOOLS, stream=True
            ):
                kinds.append(event.type)
                if event.type == "response.completed":
                    response = event.response
            assert kinds[0] == "response.created", kinds
            assert response is not None, kinds
        else:
            response = client.responses.create(
                model=gateway_model, input=items, tools=RESPONSES_TOOLS
            )
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            return {"rounds": rounds, "answer": response.output_text}
        for c in calls:
            assert c.call_id and c.name in ("get_weather", "get_time"), c
            assert isinstance(json.loads(c.arguments), dict), c
        rounds.append([c.name for c in calls])
        for c in calls:
            items.append(
                {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
            )
        for c in calls:
            items.append(
                {"type": "function_call_output", "call_id": c.call_id, "output": "sunny at noon"}
            )
    raise AssertionError("the gateway never answered")


seen["gateway_responses_whole"] = gateway_responses(False)
seen["gateway_responses_streamed"] = gateway_responses(True)

try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    seen["wrong_token"] = "accepted"
except openai.AuthenticationError as e:
    seen["wrong_token"] = e.status_code

print(json.dumps(seen))
