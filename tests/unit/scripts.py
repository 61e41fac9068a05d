"""Scripted 'models' for the ScriptedEngine, shared by the actor and evaluation tests."""

from __future__ import annotations

import re

__all__ = ["calculator_script"]


def calculator_script(tokenizer, eot: int, mode: str):
    """A 'model' that solves the calculator task (or fails it in a chosen way)."""
    from agentrl.environments.tasks.calculator.arith import evaluate

    def respond(prompt_ids: list[int], version: int) -> list[int]:
        # the last question (the opening turns hold a solved demo of the format)
        text = tokenizer.decode(prompt_ids).rsplit("<|im_start|>user", 1)[1]
        expr = re.search(r'compute "([^"]+)"', text).group(1)
        if mode == "malformed":
            reply = '<tool_call>{"name": "calculate", "arguments": {</tool_call>'
        elif "<|im_start|>tool" not in text:
            args = f'{{"expression": "{expr}"}}'
            reply = f'<tool_call>{{"name": "calculate", "arguments": {args}}}</tool_call>'
        else:
            value = float(evaluate(expr)) + (1 if mode == "wrong" else 0)
            reply = (
                f'<tool_call>{{"name": "answer", "arguments": {{"value": {value}}}}}</tool_call>'
            )
        return [*tokenizer.encode(reply, add_special_tokens=False), eot]

    return respond
