#!/usr/bin/env python3
"""qa-bench: one task of a tiny question-answering benchmark.

    python task_impl.py TASK     read the dataset, ask the API the task's question, have a judge
                                 model grade the answer, score it, write $BW_OUT/TASK.json; exit 1
                                 if the API or the judge did not answer
    python task_impl.py --plan   print the tasks and the scoring package's version

`requests` (the HTTP stack under the official Python SDKs; Debian's, in the work image) plus
`benchscore`, which setup.sh installs from the package index. Written as benchmarks are, with no
Benchwright in mind:
- the API call carries no key: the run's proxy adds the one the vault holds for the API's host;
- the judge call reads its key from the environment, as SDKs do (`JUDGE_API_KEY`); inside a run
  that variable holds a placeholder (`bw-placeholder-JUDGE_API_KEY-...`), which the proxy swaps
  for the vault's key on the judge's host only, so the key never enters this sandbox either;
- the dataset host is read-only in the vault (GET and HEAD): reading works, and the task's
  attempt to upload its result there is refused by the proxy (403 naming the limit), the way a
  read-only source host keeps a benchmark from sending data out through it.
"""

import json
import os
import sys

import benchscore
import requests

# An API your vault has a rule for (the proxy injects its key). api.demo.test is the demo
# upstream's, speaking the OpenAI chat format; QA_BENCH_API points elsewhere (outside Benchwright).
API = os.environ.get("QA_BENCH_API", "https://api.demo.test/v1/chat/completions")
MODEL = os.environ.get("QA_BENCH_MODEL", "demo-model")
# A judge model behind an ordinary vault rule; its key comes from the environment, as SDKs read it.
JUDGE = os.environ.get("QA_BENCH_JUDGE", "https://judge.demo.test/v1/chat/completions")
# The dataset's host, read-only in the vault.
DATA = os.environ.get("QA_BENCH_DATA", "https://data.demo.test/datasets/qa")

TASKS = {
    "hello": {"question": "Say hello to the world.", "reference": "Hello world"},
    "hello-there": {"question": "Greet the world warmly.", "reference": "hello there world"},
    "goodbye": {"question": "Say goodbye to the world.", "reference": "goodbye world"},
}


def chat(url, question, headers=None):
    """One chat completion: (status, the answer or None, an error text or None)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
    try:
        response = requests.post(url, json=body, headers=headers or {}, timeout=30)
    except requests.RequestException as error:
        return None, None, str(error)
    if response.status_code != 200:
        return response.status_code, None, response.text[:2000]
    return 200, response.json()["choices"][0]["message"]["content"], None


def judge(question, answer):
    """The judge's verdict on an answer, authenticated with the key the environment names."""
    key = os.environ.get("JUDGE_API_KEY", "")
    status, verdict, error = chat(
        JUDGE,
        f"Question: {question}\nAnswer: {answer}\nIs the answer right?",
        {"authorization": f"Bearer {key}"},
    )
    # What the task held: a placeholder inside a run, never the key (only its kind is recorded).
    held = "placeholder" if key.startswith("bw-placeholder-") else ("none" if not key else "a key")
    return {"url": JUDGE, "status": status, "verdict": verdict, "error": error, "keyInEnvironment": held}


def dataset(name, result):
    """Reads the task's item from the dataset host, then tries to upload the result there."""
    try:
        read = requests.get(f"{DATA}/{name}.json", timeout=30).status_code
    except requests.RequestException as error:
        read = str(error)
    try:
        response = requests.post(f"{DATA}/results/{name}.json", json=result, timeout=30)
        write, said = response.status_code, response.text.strip().splitlines()[:1]
    except requests.RequestException as error:
        write, said = None, [str(error)]
    return {"url": DATA, "read": read, "write": write, "writeAnswer": said[0] if said else ""}


def run(name):
    task = TASKS[name]
    status, answer, error = chat(API, task["question"])
    result = {
        "task": name,
        "question": task["question"],
        "reference": task["reference"],
        "answer": answer,
        "score": benchscore.score(answer, task["reference"]) if answer is not None else None,
        "api": {"url": API, "status": status, "error": error},
        "judge": judge(task["question"], answer),
        "package": {"name": "benchscore", "version": benchscore.__version__, "file": benchscore.__file__},
    }
    result["dataset"] = dataset(name, {"task": name, "score": result["score"]})
    out = os.environ.get("BW_OUT", "out")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(
        json.dumps(
            {
                "task": name,
                "status": status,
                "judge": result["judge"]["status"],
                "upload": result["dataset"]["write"],
                "score": result["score"],
            }
        )
    )
    return 0 if status == 200 and result["judge"]["status"] == 200 else 1


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
