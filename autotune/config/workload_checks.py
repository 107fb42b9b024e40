"""The objective's workload against the models a study boots, checked before anything boots: the tokenizer a
text workload needs, a dataset's prompts within each model's vocabulary and positions, and the mean request
within the positions. A request the server must refuse would fail every trial alike, without a word about the
objective."""

from __future__ import annotations

import typing
from pathlib import Path

from autotune.errors import SpecError
from autotune.measure.plan import Objective


def check_prompt_tokenizer(objective: Objective, models: typing.Iterable[str]) -> None:
    """A workload that sends text (or reads a dataset) needs each model's tokenizer.json: say so before anything
    boots if one has none (the tiny models always have one; a hub id's is fetched if the cache lacks it). Then a
    dataset's prompts are tokenized as the server will and checked against each model (check_dataset_lengths)."""
    workload = objective.workload
    if not workload.sends_text and workload.dataset is None:
        return
    from autotune.engine.models import hub_file, resolve_model
    from autotune.errors import ModelUnavailable
    from autotune.measure.workload import tokenizer_file

    key = "workload.dataset" if workload.dataset is not None and not workload.sends_text else "workload.prompt"
    for model in models:
        served = resolve_model(model)[0]
        if tokenizer_file(served) is None and not Path(served).is_dir():
            try:  # a hub model's tokenizer comes with its checkpoint, later: fetched now, to check with it
                hub_file(served, "tokenizer.json")
            except ModelUnavailable as e:
                raise SpecError(str(objective.path), key, f"the workload needs {model}'s tokenizer.json: {e}; "
                                                          "send \"token_ids\" prompts") from None
        if tokenizer_file(served) is None:
            raise SpecError(str(objective.path), key,
                            f"the workload needs the model's tokenizer.json, and {model} has none (a directory "
                            "without one); send \"token_ids\" prompts")
        if workload.dataset is not None:
            check_dataset_lengths(workload.dataset, served, workload.output_len.mean)


def check_dataset_lengths(dataset: Path, model: str, default_output_len: int) -> None:
    """Every prompt of `dataset` tokenized with `model`'s tokenizer, its ids inside the vocabulary, and prompt plus
    output inside the model's positions (a request the server must refuse would fail every trial alike)."""
    from autotune.engine.models import model_config
    from autotune.measure.datasets import read_dataset
    from autotune.measure.workload import prompt_encoder, prompt_ids

    config = model_config(model)
    text = config.get("text_config", config)
    vocab, positions = int(text["vocab_size"]), int(text.get("max_position_embeddings") or 0)
    tokenize = prompt_encoder(model)
    for row in read_dataset(dataset):
        ids, out = prompt_ids(row, str(dataset), vocab, tokenize)
        out = out or default_output_len
        if positions and len(ids) + out > positions:
            raise SpecError(str(dataset), row.where, f"{len(ids):,} prompt tokens + {out:,} output tokens exceed "
                                                     f"the {positions:,} positions of {model}")


def check_workload_fits(objective: Objective, models: typing.Iterable[str]) -> None:
    """A request of the workload's mean lengths must fit in each model's positions: the server refuses a longer
    one, and every level of every trial would fail without a word about the objective."""
    from autotune.engine.models import resolve_model
    from autotune.errors import ModelUnavailable
    from autotune.fit.feasibility import model_shape

    workload = objective.workload
    if workload.dataset is not None:  # lengths come from the dataset's prompts
        return
    tokens = workload.input_len.mean + workload.output_len.mean
    for model in models:
        try:
            positions = model_shape(resolve_model(model)[0]).max_position_embeddings
        except ModelUnavailable:  # said with its key by check_inputs
            continue
        if tokens > positions:
            raise SpecError(str(objective.path), "workload.input_len",
                            f"requests of {workload.input_len.mean:,} tokens in and {workload.output_len.mean:,} out "
                            f"exceed the {positions:,} positions of {model}")
