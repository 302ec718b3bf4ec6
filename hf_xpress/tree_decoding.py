"""Tree verification: several draft branches checked in one target forward (greedy or sampled).

    import hf_xpress
    out = target.generate(input_ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter, tree_width=3,
                          max_new_tokens=256)
    drafter.stats.tau

A chain round (`generate(..., assistant_model=drafter)`) verifies the drafter's best token for each slot, so a wrong
slot 1 makes the round yield one token. A tree round verifies the drafter's `tree_width` best tokens for slot 1, each
continued over the next slots by the drafter conditioned on that branch (`XPressDrafterModel.propose_tree`), in one
target forward: the tokens are laid out as `[anchor, branch 0, branch 1, ...]` with an ancestor-only 4D attention
mask (each token sees the cache, the anchor and its own branch up to itself) and position ids by depth. The target's
choice at each node decides the path: the longest branch prefix it agrees with, then its own next token. The
key/value cache keeps the path's entries only (`keep_cache_rows`), and the drafter's context gets the path's target
hidden states. Greedy output is plain greedy `generate`'s, token for token (in float32; in bfloat16 a wider verify
forward can flip near-ties, as for chains). With `do_sample=True` the target's choice at each node is a sample of
its processed distribution there (temperature, top-k, ...), and the path follows the branch that drew it, so every
committed token is an exact sample of the target given the tokens before it, as when transformers verifies
prompt-lookup drafts by sampling. A node is then accepted with the target's probability of its draft, less than a
chain's rejection sampling (which accepts with min(1, p/q)) would give the same draft.

A tree is worth it where a wider verify forward costs about as much as a narrow one (a GPU; a CPU in bfloat16,
measured in docs/benchmarks.md); the drafter's per-round work is one forward as for a chain plus one refiner read
per slot for all branches.

It plugs into transformers' public `custom_generate` hook (a callable): `generate` prepares the generation config,
logits processors, stopping criteria and the cache, then hands the decoding loop to `tree_decoding`. transformers
passes such a callable only the keyword arguments its signature adds to `_sample`'s, so the drafter comes as
`drafter=` (not `assistant_model=`), and neither a `streamer` nor a `tokenizer` given to `generate` reaches it: stop
strings come as `stopping_criteria=StoppingCriteriaList([StopStringCriteria(tokenizer, [...])])`. Every stopping
criterion is checked after each committed token, so the output stops where plain `generate` stops.

With `prompt_lookup_num_tokens` (a generation setting, as for chains), a round first tries transformers' prompt
lookup and verifies its continuation as a single branch; the drafter's tree runs only where lookup finds nothing.

Limits, each with a clear error: batch size 1 without padding (like transformers' assisted generation), token ids
only (no `return_dict_in_generate`), no `assistant_ensemble_weight`, and a cache of full-attention `DynamicLayer`s
(the default cache of decoder-only models without sliding-window or linear-attention layers).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, DynamicLayer

from .generation import XPressCandidateGenerator, first_stop, is_xpress_drafter

DEFAULT_TREE_WIDTH = 3


def tree_attention_mask(width: int, depth: int, past: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask `[1, 1, 1 + W*D, past + 1 + W*D]` for `[anchor, branch 0 slots 1..D, branch 1 ...]` after `past`
    cached tokens: 0 where a token may attend (the cache, the anchor, its own branch up to itself), dtype min elsewhere."""
    size = 1 + width * depth
    allowed = torch.zeros(size, size, dtype=torch.bool, device=device)
    allowed[:, 0] = True
    branch = torch.tril(torch.ones(depth, depth, dtype=torch.bool, device=device))
    for w in range(width):
        rows = slice(1 + w * depth, 1 + (w + 1) * depth)
        allowed[rows, rows] = branch
    allowed = torch.cat([torch.ones(size, past, dtype=torch.bool, device=device), allowed], dim=1)
    mask = torch.zeros(size, past + size, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def keep_cache_rows(cache: DynamicCache, start: int, rows: list[int]) -> None:
    """Keep, of the entries from `start` on, only those at `start + r` for `r` in `rows` (increasing), moved to
    `start, start + 1, ...`; drop everything after them. The one place that edits a cache's tensors: transformers'
    caches can only be cropped at the end, and a tree's accepted path is not always its first branch."""
    _check_cache(cache)
    contiguous = rows == list(range(len(rows)))
    index = None if contiguous else torch.tensor(rows, dtype=torch.long)
    for layer in cache.layers:
        if index is not None:
            idx = index.to(layer.keys.device) + start
            end = start + len(rows)
            layer.keys[..., start:end, :] = layer.keys.index_select(-2, idx)
            layer.values[..., start:end, :] = layer.values.index_select(-2, idx)
        layer.crop(-(layer.get_seq_length() - start - len(rows)))


def _check_cache(cache) -> None:
    """A clear error unless `cache` is a DynamicCache whose layers are all filled full-attention `DynamicLayer`s."""
    layers = getattr(cache, "layers", [])
    if not isinstance(cache, DynamicCache) or not all(type(l) is DynamicLayer and l.is_initialized for l in layers):
        kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])})
        raise ValueError(
            f"tree decoding needs a DynamicCache of full-attention layers (DynamicLayer), to keep the accepted path's "
            f"entries; this model's cache is {type(cache).__name__} with {kinds}. Use generate(assistant_model=drafter) "
            "(chain verification) for this model."
        )


def _pick(scores: torch.Tensor, sample: bool) -> torch.LongTensor:
    """Processed scores `[N, V]` -> the target's token per row `[N]`: argmax, or a sample of softmax(scores)."""
    if not sample:
        return scores.argmax(dim=-1)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[:, 0]


def _target_choices(logits: torch.Tensor, generator: XPressCandidateGenerator, input_ids: torch.LongTensor,
                    tree: torch.LongTensor, sample: bool) -> torch.LongTensor:
    """The target's token at every tree node: logits `[1 + W*D, V]` float32 -> `[1 + W*D]`, greedy or sampled.
    Logits processors see each node's own prefix (the sequence, then the node's branch up to it), as in plain
    `generate`: the generator's hook, which processes a chain's draft slots the same way, runs once per branch."""
    if not generator.logits_processor:
        return _pick(logits, sample)
    hook = generator._logits_hook(input_ids)
    width, depth = tree.shape
    scores = torch.empty_like(logits)
    scores[:1] = hook(logits[None, :1], 0, None)[0]  # the anchor's row: the sequence itself
    for w in range(width):
        rows = slice(1 + w * depth, 1 + (w + 1) * depth)
        scores[rows] = hook(logits[None, rows], 1, tree[w : w + 1])[0]  # slot k + 1 sees the branch's slots <= k + 1
    return _pick(scores, sample)


def _walk(tree: torch.LongTensor, choices: list[int]) -> tuple[list[int], list[int]]:
    """The accepted path: (its rows in the verified block, the tokens it commits: accepted drafts + the target's next).
    tree `[W, D]` as lists; choices: the target's token at every row."""
    width, depth = len(tree), len(tree[0]) if tree else 0
    rows, tokens = [0], []
    target = choices[0]
    branch = next((w for w in range(width) if tree[w][0] == target), None)
    if branch is not None:
        for k in range(depth):
            if tree[branch][k] != target:
                break
            tokens.append(target)
            rows.append(1 + branch * depth + k)
            target = choices[rows[-1]]
    return rows, tokens + [target]


def tree_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter=None,
    tree_width: int = DEFAULT_TREE_WIDTH,
    **model_kwargs,
) -> torch.LongTensor:
    """Greedy or sampled decoding with tree verification (see the module docstring); returns `[1, n + new]` ids.

    drafter: an xPress drafter (any refiner); drafts per branch: its `num_assistant_tokens` (all B-1 slots if None);
    tree_width: branches, the drafter's best tokens for slot 1 (1 = a chain with the branch-conditioned proposal).
    """
    if drafter is None or not is_xpress_drafter(drafter):
        raise ValueError("tree_decoding needs drafter=<an xPress drafter>, e.g. generate(ids, custom_generate="
                         "hf_xpress.tree_decoding, drafter=drafter); got "
                         f"{'nothing' if drafter is None else type(drafter).__name__}.")
    if int(tree_width) < 1:
        raise ValueError(f"tree_width must be at least 1, got {tree_width}.")
    if getattr(generation_config, "assistant_ensemble_weight", None) is not None:
        raise ValueError("tree_decoding verifies against the target alone; assistant_ensemble_weight is not supported.")
    if input_ids.shape[0] != 1:
        raise ValueError(f"tree_decoding supports batch size 1; got {input_ids.shape[0]}. Call generate once per prompt.")
    if generation_config.return_dict_in_generate:
        raise ValueError("tree_decoding returns token ids only; return_dict_in_generate=True is not supported.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("tree_decoding takes an unpadded prompt (its attention_mask has zeros).")
    cache = model_kwargs.get("cache")
    if cache is None:
        cache = DynamicCache(config=model.config)
    generator = XPressCandidateGenerator(model, drafter, generation_config, logits_processor)
    stats, clock, overrides = generator.stats, generator._clock, generator.model_kwargs_overrides
    lm_head = generator.main_model_output_embeddings
    max_length = generation_config.max_length

    outputs = model(input_ids, cache=cache, use_cache=True, logits_to_keep=1, **overrides)
    _check_cache(cache)
    logits = outputs.logits[:, -1].float()
    sample = bool(generation_config.do_sample)
    next_token = _pick(logits_processor(input_ids, logits) if len(logits_processor) else logits, sample)
    input_ids = torch.cat([input_ids, next_token[:, None]], dim=1)
    generator._keep_features(input_ids, outputs)  # the prompt's features

    while not bool(stopping_criteria(input_ids, logits).all()):
        length = input_ids.shape[1]
        room = max_length - length - 1
        depth = min(generator.num_assistant_tokens, room)
        start = clock()
        looked_up = generator.lookup_continuation(input_ids)
        if looked_up:  # prompt lookup found a continuation: verify it as a one-branch tree
            tree, depth = input_ids.new_tensor([looked_up]), len(looked_up)
            drafted = refined = clock()
        elif depth > 0:
            hidden = generator._draft_forward(input_ids)
            base, vocab_ids = drafter.draft_scores(hidden[:, 1 : 1 + depth], lm_head)
            drafted = clock()
            tree = drafter.propose_tree(hidden, base, input_ids[:, -2:], tree_width, vocab_ids).to(input_ids.device)
            refined = clock()
        else:  # one token left: a plain step
            tree = input_ids.new_empty(0, 0)
        width = tree.shape[0]
        block = torch.cat([input_ids[0, -1:], tree.reshape(-1)])[None]
        positions = length - 1 + torch.cat([block.new_zeros(1), torch.arange(1, depth + 1).repeat(width).to(block)])
        outputs = model(
            block, position_ids=positions[None], cache=cache, use_cache=True,
            attention_mask=tree_attention_mask(width, depth if width else 0, length - 1, model.dtype, block.device),
            **overrides,
        )
        logits = outputs.logits[0].float()
        choices = _target_choices(logits, generator, input_ids, tree, sample)
        rows, new = _walk(tree.tolist(), choices.tolist())
        # Never past max_length, and nothing after the first token at which a stopping criterion fires (EOS, a stop
        # string, ...): plain `generate` checks them after every token.
        new = new[: max_length - length]
        stop = first_stop(stopping_criteria, input_ids, new[:-1], logits[rows[: len(new) - 1]])
        new = new if stop is None else new[: stop + 1]  # (the last token is checked at the top of the loop)
        rows = rows[: len(new)]  # the anchor and the committed drafts; the last committed token is the next anchor
        keep_cache_rows(cache, length - 1, rows)
        input_ids = torch.cat([input_ids, torch.tensor([new], dtype=input_ids.dtype, device=input_ids.device)], dim=1)
        # The drafter's context: the path's target features (`_keep_features` takes the rows it has not seen).
        generator._keep_features(input_ids, SimpleNamespace(hidden_states=tuple(
            None if h is None else h[:, rows] for h in outputs.hidden_states)))
        logits = logits[rows[-1] : rows[-1] + 1]
        if depth > 0:
            stats.draft_time += drafted - start
            stats.refine_time += refined - drafted
            passes = depth if drafter.config.refiner and not looked_up else 0  # one refiner read per slot
            generator._record_round(tree.reshape(-1).tolist(), passes, bool(looked_up), refined, proposed=depth)
            stats.verify_time += clock() - refined
            stats.accepted.append(len(new) - 1)
    return input_ids


__all__ = ["DEFAULT_TREE_WIDTH", "keep_cache_rows", "tree_attention_mask", "tree_decoding"]
