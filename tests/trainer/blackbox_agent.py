"""A black-box agent the trainer runs in test_trainer_external_agent (Python's standard library
only): reads the step's prompts file, talks to the trainer's rollout router with each row's
session id, records what it saw, writes its rewards.

Modes (argv[1]; argv[2] is the record file, JSON lines appended):
  solve  two turns per row, all rows at once: ask, then append the answer and a tool message (a
         calculator's result) and ask again; every turn's prompt_token_ids, token_ids and log-probs
         go to the record. Reward 2.5 for sample 0 of each prompt; the other samples are left to the
         reward function.
  die    one turn for the first row, then the agent kills itself (SIGKILL).
  hang   one turn for the first row, then a child process (argv[3], a marker, on its command
         line) and the agent sleep until the trainer kills the process group.
  fail   prints why it gives up and exits with code 3 without a request.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from agent_session import call  # noqa: E402

RECORD = sys.argv[2]
LOCK = threading.Lock()
ROWS = [json.loads(line) for line in open(os.environ["HYFLOW_PROMPTS_FILE"])]


def ask(row, messages, turn):
    # a seeded request: its draws do not depend on what else the server is running
    seed = 1000 * row["sample"] + 10 * ROWS.index(row) + turn
    body = {"model": "hyflow", "messages": messages, "max_tokens": 6, "temperature": 1.0, "seed": seed,
            "logprobs": True, "return_token_ids": True}
    answer = call("/chat/completions", body, row["session_id"])
    choice = answer["choices"][0]
    turn_record = {"session_id": row["session_id"], "prompt_ids": answer["prompt_token_ids"],
                   "completion_ids": choice["token_ids"],
                   "log_probs": [entry["logprob"] for entry in choice["logprobs"]["content"]]}
    with LOCK:
        with open(RECORD, "a") as out:
            out.write(json.dumps(turn_record) + "\n")
    return choice["message"]


def solve(row):
    messages = list(row["messages"])
    reply = ask(row, messages, 0)
    messages.append({"role": "assistant", "content": reply.get("content") or ""})
    messages.append({"role": "tool", "content": "calculator: " + str(row["ground_truth"])})
    ask(row, messages, 1)


def main():
    mode = sys.argv[1]
    if mode == "solve":
        threads = [threading.Thread(target=solve, args=(row,)) for row in ROWS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with open(os.environ["HYFLOW_REWARDS_FILE"], "w") as out:
            for row in ROWS:
                if row["sample"] == 0:
                    out.write(json.dumps({"session_id": row["session_id"], "reward": 2.5}) + "\n")
        print("solved", len(ROWS))
    elif mode == "die":
        ask(ROWS[0], ROWS[0]["messages"], 0)
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "hang":
        ask(ROWS[0], ROWS[0]["messages"], 0)
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", sys.argv[3]])
        print("hanging", flush=True)
        time.sleep(1000)
    elif mode == "fail":
        print("agent gives up: no luck today", flush=True)
        sys.exit(3)


main()
