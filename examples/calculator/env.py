"""A multi-turn tool environment: arithmetic with a `calculate` tool the model calls through
OpenAI function calling; rewarded for the right number, with the tool use counted."""

from __future__ import annotations

import ast
import operator

from rlbus.environment import TaskSet, metric, reward, tool
from rlbus.environment.task_sources.sources import reasoning_gym

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def evaluate(node: ast.AST) -> float:
    """Arithmetic only: numbers, + - * /, parentheses (no names, calls or attributes)."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:80]}")


def as_number(text: str) -> float | None:
    try:
        return float(text.strip().rstrip("."))
    except ValueError:
        return None


class Calculator(TaskSet):
    name = "calculator"
    system_prompt = "Use the calculate tool to compute the result, then reply with the number only."
    defaults = {"harness": {"kind": "tools", "max_turns": 4}}

    def rows(self):
        return reasoning_gym(
            "basic_arithmetic", size=self.args.get("size", 500), seed=self.args.get("seed", 0)
        )

    @tool
    def calculate(self, expression: str, state: dict) -> str:
        """Evaluate an arithmetic expression such as "(3 + 4) * 2" and return the result."""
        state["tool_calls"] = state.get("tool_calls", 0) + 1
        value = evaluate(ast.parse(expression, mode="eval"))
        return str(int(value) if float(value).is_integer() else round(value, 6))

    @reward
    def correct(self, text: str, answer: str) -> float:
        got, want = as_number(text), as_number(answer)
        return float(got is not None and want is not None and abs(got - want) < 1e-6)

    @metric
    def tool_calls(self, state: dict) -> float:
        return float(state.get("tool_calls", 0))
