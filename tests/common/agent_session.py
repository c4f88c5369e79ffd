"""The rollout server's side of the black-box test agents (tests/agents/python_agent.py,
tests/trainer/blackbox_agent.py; Python's standard library only): the base URL, bearer token
and session header the runner hands a program in its environment, and one JSON request.
Imported after putting tests/common on sys.path.
"""
import json
import os
import urllib.request

BASE = os.environ["OPENAI_BASE_URL"]
KEY = os.environ["OPENAI_API_KEY"]
HEADER = os.environ["HYFLOW_SESSION_HEADER"]


def call(path, body=None, session=None):
    """GET `path` (POST `body` as JSON when given) under the base URL, in `session` when given;
    returns the decoded JSON answer."""
    headers = {"Authorization": "Bearer " + KEY, "Content-Type": "application/json"}
    if session:
        headers[HEADER] = session
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(BASE + path, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)
