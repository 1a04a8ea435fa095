# The run's command in test/e2e/python-boundary.test.ts (case N1): Python through the boundary
# with nothing but the work image's python3 and Debian's requests and httpx (no pip). It reads
# its key from the environment as a benchmark does, calls the rule's host with it through both
# libraries, calls the model lane as the official openai and anthropic SDKs do (they cannot be
# installed here: their requests are copied, with the headers they send), and prints one JSON
# line of what it saw. It never passes `verify=`: the run CA is trusted only through the
# variables the wiring set. Usage: python3 python-client.py RULE_HOST OTHER_HOST

import json
import os
import platform
import sys

import httpx
import requests

rule_host, other_host = sys.argv[1], sys.argv[2]
out = {}


def attempt(name, fn):
    try:
        out[name] = fn()
    except Exception as error:  # every failure is reported, never raised
        out[name] = {"error": type(error).__name__, "message": str(error)[:300]}


token = os.environ.get("API_TOKEN")
# The placeholder itself is no secret: printed so that the test can check its shape.
out["token"] = token
out["tokenIsPlaceholder"] = token is not None and token.startswith("bw-placeholder-")

# Which bundle each library would verify with, from the environment alone (trust_env, no verify=).
out["ca"] = {
    "REQUESTS_CA_BUNDLE": os.environ.get("REQUESTS_CA_BUNDLE"),
    "CURL_CA_BUNDLE": os.environ.get("CURL_CA_BUNDLE"),
    "SSL_CERT_FILE": os.environ.get("SSL_CERT_FILE"),
    "requests": requests.Session().merge_environment_settings(
        f"https://{rule_host}/", {}, None, True, None
    )["verify"],
    "httpx": httpx._utils.get_ca_bundle_from_env(),
}

bearer = {"Authorization": f"Bearer {token}"}


def seen(response):
    body = response.json()
    return {"status": response.status_code, "keyPresent": body.get("keyPresent"), "keyMatches": body.get("keyMatches")}


attempt("requestsRule", lambda: seen(requests.get(f"https://{rule_host}/from-requests", headers=bearer, timeout=20)))
attempt("httpxRule", lambda: seen(httpx.get(f"https://{rule_host}/from-httpx", headers=bearer, timeout=20)))
# The placeholder sent to a host that is not its rule's: it leaves as it is.
attempt("requestsOther", lambda: seen(requests.get(f"https://{other_host}/elsewhere", headers=bearer, timeout=20)))

# ---- the model lane, as the official SDKs send (both are httpx clients) ----

model = os.environ.get("BENCHWRIGHT_MODEL")
stainless = {
    "X-Stainless-Lang": "python",
    "X-Stainless-OS": "Linux",
    "X-Stainless-Arch": "x64",
    "X-Stainless-Runtime": "CPython",
    "X-Stainless-Runtime-Version": platform.python_version(),
    "X-Stainless-Async": "false",
    "X-Stainless-Retry-Count": "0",
}
openai_headers = {
    **stainless,
    "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY')}",
    "Accept": "application/json",
    "Content-Type": "application/json",
    "User-Agent": "OpenAI/Python 1.0.0",
    "X-Stainless-Package-Version": "1.0.0",
}
anthropic_headers = {
    **stainless,
    "x-api-key": os.environ.get("ANTHROPIC_API_KEY", ""),
    "anthropic-version": "2023-06-01",
    "Accept": "application/json",
    "Content-Type": "application/json",
    "User-Agent": "Anthropic/Python 0.40.0",
    "X-Stainless-Package-Version": "0.40.0",
}
messages = [{"role": "user", "content": "Say hello"}]


def sse_data(lines):
    """The JSON payloads of server-sent events, up to OpenAI's [DONE]."""
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def openai_plain():
    r = httpx.post(
        f"{os.environ['OPENAI_BASE_URL']}/chat/completions",
        headers=openai_headers,
        json={"model": model, "messages": messages},
        timeout=30,
    )
    body = r.json()
    return {"status": r.status_code, "text": body["choices"][0]["message"]["content"]}


def openai_stream():
    text = ""
    with httpx.stream(
        "POST",
        f"{os.environ['OPENAI_BASE_URL']}/chat/completions",
        headers={**openai_headers, "Accept": "text/event-stream"},
        json={"model": model, "messages": messages, "stream": True},
        timeout=30,
    ) as r:
        for chunk in sse_data(r.iter_lines()):
            for choice in chunk.get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
        return {"status": r.status_code, "text": text}


def anthropic_plain():
    r = httpx.post(
        f"{os.environ['ANTHROPIC_BASE_URL']}/v1/messages",
        headers=anthropic_headers,
        json={"model": model, "max_tokens": 64, "messages": messages},
        timeout=30,
    )
    body = r.json()
    return {"status": r.status_code, "text": "".join(b.get("text", "") for b in body["content"])}


def anthropic_stream():
    # Through requests this time: the lane's answer read line by line as SSE.
    text = ""
    with requests.post(
        f"{os.environ['ANTHROPIC_BASE_URL']}/v1/messages",
        headers={**anthropic_headers, "Accept": "text/event-stream"},
        json={"model": model, "max_tokens": 64, "messages": messages, "stream": True},
        stream=True,
        timeout=30,
    ) as r:
        for event in sse_data(r.iter_lines()):
            if event.get("type") == "content_block_delta":
                text += event["delta"].get("text", "")
        return {"status": r.status_code, "text": text}


attempt("openaiPlain", openai_plain)
attempt("openaiStream", openai_stream)
attempt("anthropicPlain", anthropic_plain)
attempt("anthropicStream", anthropic_stream)

print(json.dumps(out))
