"""A small agent that knows nothing about rlbus: the official `openai` client, configured by
OPENAI_BASE_URL / OPENAI_API_KEY like any OpenAI program. It drafts an answer, asks the model
to check it, and prints the final answer."""

import json
import os

from openai import OpenAI


def main() -> None:
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    model = os.environ.get("RLBUS_MODEL", "default")
    with open(os.environ["RLBUS_TASK_FILE"]) as f:
        task = json.load(f)
    messages = list(task["messages"])
    draft = client.chat.completions.create(model=model, messages=messages).choices[0].message
    messages += [
        {"role": "assistant", "content": draft.content},
        {"role": "user", "content": "Check your answer. Reply with the final answer only."},
    ]
    final = client.chat.completions.create(model=model, messages=messages).choices[0].message
    print(final.content)


if __name__ == "__main__":
    main()
