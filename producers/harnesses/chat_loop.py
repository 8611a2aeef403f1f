"""`single` and `tools`: a chat loop in the producer's process. The model answers; tool calls
are run and answered; a turn without tool calls goes to the user simulator, if any, whose reply
continues the conversation. Ends when nobody has more to say or after `max_turns` model calls."""

from __future__ import annotations

from rlbus.config.env import HarnessConfig
from rlbus.producers.harnesses.base import Rollout
from rlbus.producers.harnesses.tools import open_toolbox
from rlbus.producers.harnesses.users import UserSimulator
from rlbus.schemas import Messages


class ChatHarness:
    def __init__(self, config: HarnessConfig, user: UserSimulator | None):
        self.config = config
        self.user = user

    async def run(self, rollout: Rollout) -> Messages:
        use_tools = self.config.kind == "tools"
        rules = rollout.env.rules.tools if use_tools else []
        async with open_toolbox(rules, self.config.mcp_servers if use_tools else []) as toolbox:
            messages = list(rollout.prompt)
            completion: Messages = []
            for turn in range(self.config.max_turns):
                result = await rollout.session.chat(messages, tools=toolbox.schemas or None)
                added = [result.message]
                if result.message.get("tool_calls") and toolbox.schemas:
                    added += [
                        await toolbox.run(call, rollout) for call in result.message["tool_calls"]
                    ]
                elif self.user is None:
                    completion += added
                    break
                else:
                    reply = await self.user.reply(rollout, [*messages, *added], turn)
                    if reply is None:
                        completion += added
                        break
                    added.append({"role": "user", "content": reply})
                messages += added
                completion += added
            return completion
