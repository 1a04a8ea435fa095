#!/usr/bin/env python3
"""qa-bench: one task of a tiny question-answering benchmark.

    python task_impl.py TASK     ask the API the task's question, score the answer, write
                                 $BW_OUT/TASK.json; exit 1 if the API did not answer
    python task_impl.py --plan   print the tasks and the scoring package's version

Standard library only, plus `benchscore`, which setup.sh installs from the package index. The API
call carries no key: the run's proxy adds the one the vault holds for the API's host, so the key
never enters this sandbox.
"""

import json
import os
import sys
import urllib.error
import urllib.request

import benchscore

# An API your vault has a rule for (the proxy injects its key). api.demo.test is the demo
# upstream's, speaking the OpenAI chat format; QA_BENCH_API points elsewhere (outside Benchwright).
API = os.environ.get("QA_BENCH_API", "https://api.demo.test/v1/chat/completions")
MODEL = os.environ.get("QA_BENCH_MODEL", "demo-model")

TASKS = {
    "hello": {"question": "Say hello to the world.", "reference": "Hello world"},
    "hello-there": {"question": "Greet the world warmly.", "reference": "hello there world"},
    "goodbye": {"question": "Say goodbye to the world.", "reference": "goodbye world"},
}


def ask(question):
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": question}]}).encode()
    request = urllib.request.Request(API, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            reply = json.load(response)
            return response.status, reply["choices"][0]["message"]["content"], None
    except urllib.error.HTTPError as error:
        return error.code, None, error.read(2000).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as error:
        return None, None, str(error)


def run(name):
    task = TASKS[name]
    status, answer, error = ask(task["question"])
    result = {
        "task": name,
        "question": task["question"],
        "reference": task["reference"],
        "answer": answer,
        "score": benchscore.score(answer, task["reference"]) if answer is not None else None,
        "api": {"url": API, "status": status, "error": error},
        "package": {"name": "benchscore", "version": benchscore.__version__, "file": benchscore.__file__},
    }
    out = os.environ.get("BW_OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({"task": name, "status": status, "score": result["score"]}))
    return 0 if status == 200 else 1


def main(argv):
    if argv == ["--plan"]:
        print(json.dumps({"tasks": sorted(TASKS), "benchscore": benchscore.__version__}))
        return 0
    if len(argv) != 1 or argv[0] not in TASKS:
        print(f"usage: task_impl.py TASK | --plan (tasks: {', '.join(sorted(TASKS))})", file=sys.stderr)
        return 2
    return run(argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
