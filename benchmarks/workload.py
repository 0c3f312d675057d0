"""Reasoning prompts (AIME 2024, AMC 2023) rendered with the model's chat template.

The data files are JSON lines with a ``problem`` field; they live outside the repository
(``--data-dir``). Prompts are taken in file order, datasets in the given order, and
cycled when more are requested than there are problems, so every config of a comparison
sees exactly the same requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
DEFAULT_DATASETS = ("aime24", "amc23")


@dataclass(frozen=True)
class Prompt:
    """A chat-templated prompt: ``text`` is what a text client sends, ``input_ids`` its tokens."""

    source: str  # "<dataset>:<line index>"
    text: str
    input_ids: list[int]


def load_rows(data_dir: Path, name: str) -> list[dict[str, Any]]:
    """The JSON rows of ``<data_dir>/<name>.jsonl``, blank lines skipped: row i is the source ``<name>:<i>``."""
    path = Path(data_dir) / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"prompt file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_problems(data_dir: Path, datasets: Sequence[str] = DEFAULT_DATASETS) -> list[tuple[str, str]]:
    """(source, problem) pairs from ``<data_dir>/<name>.jsonl``, in file order."""
    problems: list[tuple[str, str]] = []
    for name in datasets:
        for i, row in enumerate(load_rows(data_dir, name)):
            if not isinstance(row.get("problem"), str) or not row["problem"].strip():
                raise ValueError(f"{Path(data_dir) / f'{name}.jsonl'} line {i + 1}: no 'problem' string")
            problems.append((f"{name}:{i}", row["problem"]))
    if not problems:
        raise ValueError(f"no problems in {data_dir} for datasets {list(datasets)}")
    return problems


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer  # heavy import, only when prompts are built

    return AutoTokenizer.from_pretrained(model)


def render(tokenizer: Any, source: str, problem: str) -> Prompt:
    messages = [{"role": "user", "content": problem + INSTRUCTION}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # The template already wrote every special token it wants; don't let encode add a BOS twice.
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Prompt(source=source, text=text, input_ids=list(ids))


def build_prompts(
    tokenizer: Any, data_dir: Path, num_prompts: int, datasets: Sequence[str] = DEFAULT_DATASETS
) -> list[Prompt]:
    """``num_prompts`` prompts, cycling through the problems when there are fewer."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    problems = load_problems(data_dir, datasets)
    rendered: dict[int, Prompt] = {}
    out = []
    for i in range(num_prompts):
        j = i % len(problems)
        if j not in rendered:
            rendered[j] = render(tokenizer, *problems[j])
        out.append(rendered[j])
    return out


def filler_ids(tokenizer: Any, problems: Sequence[tuple[str, str]], n_tokens: int) -> list[int]:
    """Exactly ``n_tokens`` token ids of the problems' text, joined in order (cycled) and tokenized as one
    string, so the block is real text and the same ids on every call."""
    text, ids, i = "", [], 0
    while len(ids) < n_tokens:
        text += problems[i % len(problems)][1] + "\n\n"
        i += 1
        ids = tokenizer.encode(text, add_special_tokens=False)
    return list(ids[:n_tokens])


def with_shared_prefix(
    tokenizer: Any,
    prompts: Sequence[Prompt],
    problems: Sequence[tuple[str, str]],
    prefix_tokens: int,
    long_prompt_tokens: int = 0,
) -> list[Prompt]:
    """``prompts`` behind one common ``prefix_tokens``-token block (a long "system" context of problems in
    file order), plus, with ``long_prompt_tokens``, one more request of exactly that many prompt tokens: the
    same prefix, then other problems' text, then the first prompt's question.

    The block is tokenized once and its ids are prepended, so every request starts with the very same ids
    and SGLang's radix cache can share them (a text prefix re-tokenized per request may merge tokens
    across its end). ``text`` is the decoded prefix plus the prompt's text, for reading only.
    """
    prefix = filler_ids(tokenizer, problems, prefix_tokens)
    head = tokenizer.decode(prefix)
    out = [Prompt(source=p.source, text=head + p.text, input_ids=prefix + p.input_ids) for p in prompts]
    if long_prompt_tokens:
        question = prompts[0]
        body = long_prompt_tokens - len(prefix) - len(question.input_ids)
        if body < 1:
            raise ValueError(
                f"a {long_prompt_tokens}-token long prompt leaves no room after the {len(prefix)}-token "
                f"prefix and the {len(question.input_ids)}-token question"
            )
        # The problems in reverse order, so the body is not the prefix's text again.
        filler = filler_ids(tokenizer, problems[::-1], body)
        out.append(
            Prompt(
                source=f"long:{long_prompt_tokens}",
                text=tokenizer.decode(prefix + filler) + question.text,
                input_ids=prefix + filler + question.input_ids,
            )
        )
    return out


def write_bench_serving_file(path: Path, prompts: Sequence[Prompt]) -> None:
    """Write prompts in bench_serving's ``custom`` dataset format (JSONL, first two conversation turns).

    The text is already chat-templated, so bench_serving must run without
    --apply-chat-template; the assistant turn is a placeholder because the output
    length is fixed with --sharegpt-output-len.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            convs = [{"role": "user", "content": p.text}, {"role": "assistant", "content": "placeholder answer"}]
            f.write(json.dumps({"conversations": convs}) + "\n")


def prompt_token_stats(prompts: Sequence[Prompt]) -> dict[str, float]:
    lens = [len(p.input_ids) for p in prompts]
    return {
        "min": min(lens),
        "mean": sum(lens) / len(lens),
        "max": max(lens),
        "unique": len({p.source for p in prompts}),
    }
