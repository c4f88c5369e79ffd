"""A black-box agent for test_agents_external (Python's standard library only): reads the prompts
file, talks to the rollout server with each row's session id, writes its rewards.

Modes (argv[1]):
  solve  two turns per row, all rows at once: ask, then append the answer and "Check your answer."
         and ask again. Rewards for every row but the last (left to the reward function), plus one
         line the runner must reject.
  hang   one turn for the first row, then a child process (argv carries argv[2], a marker) and
         both sleep until the runner kills the process group.
"""
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from agent_session import call  # noqa: E402

MODEL = call("/models")["data"][0]["id"]
ROWS = [json.loads(line) for line in open(os.environ["HYFLOW_PROMPTS_FILE"])]


def ask(row, messages):
    body = {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 1.0}
    return call("/chat/completions", body, row["session_id"])["choices"][0]["message"]


def solve(row, rewards):
    messages = list(row["messages"])
    for follow_up in ["Check your answer.", None]:
        reply = ask(row, messages)
        messages.append({"role": "assistant", "content": reply.get("content") or ""})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    rewards[row["session_id"]] = 1.0 if str(row["ground_truth"]) in messages[-1]["content"] else 0.0


def main():
    mode = sys.argv[1]
    if mode == "solve":
        rewards = {}
        threads = [threading.Thread(target=solve, args=(row, rewards)) for row in ROWS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with open(os.environ["HYFLOW_REWARDS_FILE"], "w") as out:
            for row in ROWS[:-1]:
                out.write(json.dumps({"session_id": row["session_id"], "reward": rewards[row["session_id"]]}) + "\n")
            out.write(json.dumps({"session_id": "nobody", "reward": 1.0}) + "\n")
        print("solved", len(ROWS))
    elif mode == "hang":
        ask(ROWS[0], ROWS[0]["messages"])
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", sys.argv[2]])
        print("hanging", flush=True)
        time.sleep(1000)


main()
