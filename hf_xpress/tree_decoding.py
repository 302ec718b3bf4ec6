"""Tree verification: several draft branches checked in one target forward (greedy or sampled).

    import hf_xpress
    out = target.generate(input_ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter, tree_width=3,
                          max_new_tokens=256)
    drafter.stats.tau
    # or a dynamic tree of the drafter's 8 most probable nodes, up to 4 deep
    drafter.config.num_assistant_tokens = 4
    out = target.generate(input_ids, custom_generate=hf_xpress.tree_decoding, drafter=drafter, tree_width=3,
                          tree_budget=8, max_new_tokens=256)

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

With `tree_budget=N` the tree is dynamic instead (EAGLE-2's): the drafter's N most probable draft nodes, each scored
by the product of its probabilities along the path (`XPressDrafterModel.propose_dynamic_tree`), as deep as the drafts
per round allow, so a round where the drafter is sure verifies a deep chain and one where it is unsure a wide bush,
for the same verify width. Either tree is `(tokens, parents)` in the loop: node i hangs from node `parents[i]` (-1:
the anchor), and the mask, the positions and the walk follow the parents.

A tree is worth it where a wider verify forward costs about as much as a narrow one (a GPU; a CPU in bfloat16,
measured in docs/benchmarks.md); the drafter's per-round work is one forward as for a chain plus one refiner read
per slot for all branches.

It plugs into transformers' public `custom_generate` hook (a callable): `generate` prepares the generation config,
logits processors, stopping criteria and the cache, then hands the decoding loop to `tree_decoding`. transformers
passes such a callable only the keyword arguments its signature adds to `_sample`'s, so the drafter comes as
`drafter=` (not `assistant_model=`). Neither the `streamer` nor the `tokenizer` given to `generate` would reach it;
`hf_xpress.install()` (run on import) passes both on, so `streamer=` and `stop_strings=` with `tokenizer=` work as
for chains (the streamer gets the prompt, every committed token and `end()`). Without that hook (the Hub recipe run
as remote code) a streamer comes as `tree_streamer=` and stop strings as a stopping criterion. Every stopping
criterion is checked after each committed token, so the output stops where plain `generate` stops.

With `prompt_lookup_num_tokens` (a generation setting, as for chains), a round first tries transformers' prompt
lookup and verifies its continuation as a single branch; the drafter's tree runs only where lookup finds nothing.
With `lookup_branch=True` too, the drafter's tree runs every round and lookup's continuation joins it as one more
branch (`add_branch`: sharing the nodes it agrees with), so a round is not lost where lookup is wrong and the drafter
right; the verify forward is wider by the branch's new nodes in the rounds where lookup finds something.

Limits, each with a clear error: batch size 1 without padding (like transformers' assisted generation), greedy or
sampling only, a prompt given as token ids at positions 0..n-1 (no `inputs_embeds`, `position_ids` or a cache that
already holds tokens), token ids returned (no `return_dict_in_generate`), no `assistant_ensemble_weight`, and a cache
of full-attention `DynamicLayer`s (the default cache of decoder-only models without sliding-window or linear-attention
layers; sliding-window layers whose window covers `max_length` are kept as full-attention ones, see
`_prepare_cache`); and, as on chains, no option that scoring drafts would get wrong (`check_generation_options`).
"""

from __future__ import annotations

import numbers
from types import SimpleNamespace

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation.configuration_utils import GenerationMode

from .generation import XPressCandidateGenerator, check_prompt_inputs, first_stop, is_xpress_drafter

DEFAULT_TREE_WIDTH = 3


def chain_parents(width: int, depth: int) -> list[int]:
    """Parents of the nodes of `width` branches of `depth` slots laid out branch after branch (`[W, D]` flattened):
    a branch's slot 1 hangs from the anchor (-1), every later slot from the one before it."""
    return [-1 if k == 0 else w * depth + k - 1 for w in range(width) for k in range(depth)]


def tree_attention_mask(parents: list[int], past: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask `[1, 1, 1 + N, past + 1 + N]` for `[anchor, node 0, ..., node N-1]` after `past` cached tokens
    (node i's parent is `parents[i]`, -1: the anchor; parents come first): 0 where a token may attend (the cache, the
    anchor, its ancestors, itself), dtype min elsewhere."""
    size = 1 + len(parents)
    allowed = torch.zeros(size, size, dtype=torch.bool, device=device)
    allowed[0, 0] = True
    for i, parent in enumerate(parents):
        allowed[i + 1] = allowed[parent + 1]
        allowed[i + 1, i + 1] = True
    allowed = torch.cat([torch.ones(size, past, dtype=torch.bool, device=device), allowed], dim=1)
    mask = torch.zeros(size, past + size, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]


def node_depths(parents: list[int]) -> list[int]:
    """Each node's slot (1 for a child of the anchor)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


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


def add_branch(tokens: list[int], parents: list[int], branch: list[int]) -> tuple[list[int], list[int]]:
    """The tree `(tokens, parents)` with the chain `branch` (from the anchor) added: the branch follows the nodes
    that hold its tokens as far as they go, then its remaining tokens hang below as new nodes (appended, so parents
    still come before their children)."""
    tokens, parents = list(tokens), list(parents)
    children = {(parent, token): i for i, (token, parent) in reversed(list(enumerate(zip(tokens, parents))))}
    node = -1
    for token in branch:
        if (node, token) not in children:
            tokens.append(token)
            parents.append(node)
            children[(node, token)] = len(tokens) - 1
        node = children[(node, token)]
    return tokens, parents


def _uses_alibi(config) -> bool:
    """Whether the target's attention adds ALiBi biases (BLOOM always; Falcon and MPT where configured)."""
    text = config.get_text_config()
    return (text.model_type == "bloom" or bool(getattr(text, "alibi", False))
            or bool(getattr(getattr(text, "attn_config", None), "alibi", False)))


def _check_cache(cache, filled: bool = True) -> None:
    """A clear error unless `cache` is a DynamicCache whose layers are all full-attention `DynamicLayer`s, filled
    (`filled=False`: a caller's cache before the prefill, whose layers may not hold anything yet)."""
    layers = getattr(cache, "layers", [])
    if not isinstance(cache, DynamicCache) or not all(type(l) is DynamicLayer and (l.is_initialized or not filled)
                                                      for l in layers):
        kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])})
        raise ValueError(
            f"tree decoding needs a DynamicCache of full-attention layers (DynamicLayer), to keep the accepted path's "
            f"entries; this model's cache is {type(cache).__name__} with {kinds}. Use generate(assistant_model=drafter) "
            "(chain verification) for this model."
        )


def _prepare_cache(cache, max_length: int) -> None:
    """Refuse a cache the tree cannot keep the accepted path in (`_check_cache`, before the prefill), having first
    counted the empty sliding-window layers whose window covers `max_length` as full-attention ones: a query then sees
    every earlier key under either mask, so the tree's mask may stand for the window's. Only a cache that passes is
    changed: those layers become `DynamicLayer`s, in place."""
    if not isinstance(cache, DynamicCache):
        _check_cache(cache, filled=False)  # refuses it
    layers = [DynamicLayer() if type(layer) is DynamicSlidingWindowLayer and not layer.is_initialized
              and layer.sliding_window >= max_length else layer for layer in cache.layers]
    trial = DynamicCache()
    trial.layers = layers
    try:
        _check_cache(trial, filled=False)
    except ValueError as err:
        windows = sorted({layer.sliding_window for layer in layers if type(layer) is DynamicSlidingWindowLayer})
        hint = (f" (sliding-window layers are served while the whole sequence fits their window: max_length "
                f"{max_length} is past window {windows[0]})") if windows else ""
        raise ValueError(f"{err}{hint}") from None
    cache.layers[:] = layers


def _pick(scores: torch.Tensor, sample: bool) -> torch.LongTensor:
    """Processed scores `[N, V]` -> the target's token per row `[N]`: argmax, or a sample of softmax(scores)."""
    if not sample:
        return scores.argmax(dim=-1)
    return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1)[:, 0]


def _target_choices(logits: torch.Tensor, generator: XPressCandidateGenerator, input_ids: torch.LongTensor,
                    tokens: list[int], parents: list[int], sample: bool) -> torch.LongTensor:
    """The target's token at every tree row (the anchor, then the nodes): logits `[1 + N, V]` float32 -> `[1 + N]`,
    greedy or sampled. Logits processors see each node's own prefix (the sequence, then the node's path up to it), as
    in plain `generate`: the generator's hook, which processes a chain's draft slots the same way, runs once per leaf
    on its path from the anchor."""
    if not generator.logits_processor:
        return _pick(logits, sample)
    hook = generator._logits_hook(input_ids)
    scores = torch.empty_like(logits)
    scores[:1] = hook(logits[None, :1], 0, None)[0]  # the anchor's row: the sequence itself
    inner = set(parents)
    for leaf in (i for i in range(len(parents)) if i not in inner):
        path = [leaf]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        rows = [1 + i for i in reversed(path)]
        cond = torch.tensor([[tokens[i] for i in reversed(path)]], device=input_ids.device)
        scores[rows] = hook(logits[None, rows], 1, cond)[0]  # the node at slot k sees its path's slots <= k
    return _pick(scores, sample)


def _walk(tokens: list[int], parents: list[int], choices: list[int]) -> tuple[list[int], list[int]]:
    """The accepted path: (its rows in the verified block, the tokens it commits: accepted drafts + the target's next).
    tokens, parents: the tree's nodes; choices: the target's token at every row (row 0: the anchor, row i + 1: node i)."""
    children: dict[tuple[int, int], int] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        children.setdefault((parent + 1, token), i + 1)
    rows, new = [0], []
    target = choices[0]
    while (rows[-1], target) in children:
        new.append(target)
        rows.append(children[(rows[-1], target)])
        target = choices[rows[-1]]
    return rows, new + [target]


def _is_integer(value) -> bool:
    """An int, a numpy integer or a 0-d integer tensor; not a bool."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# What generate() hands a custom_generate callable for a text-only target, all handled here (flags with no effect on
# the ids returned, and inputs checked below); any other model input would be dropped, so it is refused.
TREE_MODEL_INPUTS = frozenset({"attention_mask", "cache", "position_ids", "use_cache", "logits_to_keep",
                               "output_attentions", "output_hidden_states", "inputs_embeds"})


def tree_decoding(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    drafter=None,
    tree_width: int = DEFAULT_TREE_WIDTH,
    tree_budget: int | None = None,
    lookup_branch: bool = False,
    tree_streamer=None,
    streamer=None,
    tokenizer=None,
    **model_kwargs,
) -> torch.LongTensor:
    """Greedy or sampled decoding with tree verification (see the module docstring); returns `[1, n + new]` ids.

    drafter: an xPress drafter (any refiner); the tree's depth: its `num_assistant_tokens` (all B-1 slots if None);
    tree_width: branches, the drafter's best tokens for slot 1 (1 = a chain with the branch-conditioned proposal);
    tree_budget: a dynamic tree instead (`XPressDrafterModel.propose_dynamic_tree`): the `tree_budget` draft nodes of
    highest path probability, growing `tree_width` children from each of the `tree_width` best nodes per slot;
    lookup_branch: with `prompt_lookup_num_tokens`, lookup's continuation joins the drafter's tree as a branch
    (`add_branch`) instead of replacing it;
    streamer: `generate`'s own `streamer`, which it has fed the prompt to (passed on by `hf_xpress`'s `install()`
    hook; transformers alone does not pass it to a `custom_generate` callable); tokenizer: likewise, for stop strings
    (`generate` builds their stopping criterion from it);
    tree_streamer: a streamer (`TextStreamer`, `TextIteratorStreamer`, ...) fed here as `generate` feeds its `streamer`,
    prompt included: for callers without the hook (the Hub recipe run as remote code).
    """
    if drafter is None or not is_xpress_drafter(drafter):
        raise ValueError("tree_decoding needs drafter=<an xPress drafter>, e.g. generate(ids, custom_generate="
                         "hf_xpress.tree_decoding, drafter=drafter); got "
                         f"{'nothing' if drafter is None else type(drafter).__name__}.")
    drafter.stats = None  # a call refused below records nothing: never the previous call's figures
    for name, value, optional in (("tree_width", tree_width, False), ("tree_budget", tree_budget, True)):
        if not (value is None and optional) and not _is_integer(value):
            raise ValueError(f"{name} must be an integer{' or None' if optional else ''}, got {value!r}.")
    tree_width, tree_budget = int(tree_width), (None if tree_budget is None else int(tree_budget))
    if tree_width < 1:
        raise ValueError(f"tree_width must be at least 1, got {tree_width}.")
    if tree_budget is not None and tree_budget < 1:
        raise ValueError(f"tree_budget must be at least 1 draft node (or None for a fixed tree), got {tree_budget}.")
    schedule = drafter.config.num_assistant_tokens_schedule
    if schedule != "constant":  # the depth is read once; a schedule that moves it would be silently ignored
        raise ValueError(f"tree_decoding's depth is the drafter's num_assistant_tokens; its num_assistant_tokens_schedule "
                         f"{schedule!r} applies to chains (generate(..., assistant_model=drafter)) only: set "
                         "drafter.config.num_assistant_tokens_schedule = 'constant' for trees.")
    if getattr(generation_config, "assistant_ensemble_weight", None) is not None:
        raise ValueError("tree_decoding verifies against the target alone; assistant_ensemble_weight is not supported.")
    if generation_config.num_beams > 1 or generation_config.num_return_sequences > 1:
        raise ValueError("tree_decoding decodes one sequence: num_beams and num_return_sequences must be 1, got "
                         f"{generation_config.num_beams} / {generation_config.num_return_sequences}.")
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.ASSISTED_GENERATION):
        raise ValueError(f"tree_decoding decodes greedily or by sampling; the generate options given ask for "
                         f"{mode.value} (penalty_alpha, dola_layers, constraints or force_words_ids).")
    if input_ids.shape[0] != 1:
        raise ValueError(f"tree_decoding supports batch size 1; got {input_ids.shape[0]}. Call generate once per prompt.")
    if _uses_alibi(model.config):  # its attention bias is built from a 2D padding mask, not the tree's 4D one
        raise ValueError(f"tree_decoding verifies a tree with a 4D attention mask, which {model.config.model_type}'s "
                         "ALiBi attention does not take; use generate(..., assistant_model=drafter) (chains).")
    check_prompt_inputs(input_ids, model_kwargs)
    unknown = sorted(k for k, v in model_kwargs.items() if v is not None and k not in TREE_MODEL_INPUTS)
    if unknown:  # e.g. a vision-language target's pixel_values: the tree runs the target on token ids alone
        raise ValueError(f"tree_decoding runs the target on token ids only and would drop these inputs: "
                         f"{', '.join(unknown)}. Use generate(..., assistant_model=drafter) (chains) for them.")
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("tree_decoding runs the target on the prompt's token ids; inputs_embeds is not supported.")
    if generation_config.return_dict_in_generate:
        raise ValueError("tree_decoding returns token ids only; return_dict_in_generate=True is not supported.")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("tree_decoding takes an unpadded prompt, and its attention_mask has zeros: a padded prompt, "
                         "or, with no attention_mask given, pad_token_id occurring in the prompt (transformers masks "
                         "those positions); pass attention_mask=torch.ones_like(input_ids) if they are real tokens.")
    positions = model_kwargs.get("position_ids")
    if positions is not None and not torch.equal(positions.cpu(), torch.arange(input_ids.shape[1])[None]):
        raise ValueError("tree_decoding places the prompt at positions 0..n-1 and does not take position_ids.")
    # The model's own cache layout decides, also when the caller passes a cache: a plain DynamicCache() has
    # full-attention layers whatever the model is, and the tree's 4D mask would replace a sliding-window layer's.
    # Sliding-window layers are served while the whole sequence fits their window (`_prepare_cache`).
    own = DynamicCache(config=model.config)
    _prepare_cache(own, generation_config.max_length)
    cache = model_kwargs.get("cache")
    if cache is None:
        cache = own
    else:  # before the prefill, which would fill a cache the tree then refuses
        _prepare_cache(cache, generation_config.max_length)
    generator = XPressCandidateGenerator(model, drafter, generation_config, logits_processor, tokenizer)
    if lookup_branch and generator.lookup is None:
        raise ValueError("lookup_branch=True adds prompt lookup's continuation to the tree: it needs "
                         "prompt_lookup_num_tokens=N (lookup's drafts per round), e.g. 10.")

    if tree_streamer is not None and streamer is not None:
        raise ValueError("Pass either generate's streamer= or tree_decoding's tree_streamer=, not both.")
    if tree_streamer is not None:
        tree_streamer.put(input_ids.cpu())  # the prompt, as `generate` puts it (it did for `streamer`)
    streamer = tree_streamer if tree_streamer is not None else streamer
    try:
        return _tree_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, drafter, generator,
                          cache, tree_width, tree_budget, lookup_branch, streamer)
    finally:
        if streamer is not None:  # also after an error: a TextIteratorStreamer's consumer must not wait forever
            streamer.end()


tree_decoding.takes_generate_streamer = True  # hf_xpress.install() passes it generate's streamer and tokenizer


def _tree_loop(model, input_ids, logits_processor, stopping_criteria, generation_config, drafter, generator, cache,
               tree_width, tree_budget, lookup_branch, streamer) -> torch.LongTensor:
    """`tree_decoding`'s prefill and rounds, its arguments checked; `streamer` (or None) gets each committed token."""
    stats, clock, overrides = generator.stats, generator._clock, generator.model_kwargs_overrides
    max_length = generation_config.max_length
    given = input_ids.device  # the ids may be on the CPU for a target on a GPU, as generate() takes them
    input_ids = input_ids.to(generator.embed_device)
    outputs = model(input_ids, cache=cache, use_cache=True, logits_to_keep=1, **overrides)
    _check_cache(cache)
    logits = outputs.logits[:, -1].float()
    sample = bool(generation_config.do_sample)
    next_token = _pick(logits_processor(input_ids, logits) if len(logits_processor) else logits, sample)
    input_ids = torch.cat([input_ids, next_token[:, None]], dim=1)
    if streamer is not None:
        streamer.put(next_token.cpu())
    generator._keep_features(input_ids, outputs)  # the prompt's features

    # Stopping criteria get what plain `generate` gives them without output_scores: the ids, and None for scores, once
    # per committed token (a criterion that fired inside a round is not asked again: one may fire only once).
    stopped = False
    while not stopped and not bool(stopping_criteria(input_ids, None).all()):
        length = input_ids.shape[1]
        room = max_length - length - 1
        depth = min(generator.num_assistant_tokens, room)
        start = clock()
        looked_up = generator.lookup_continuation(input_ids)
        drafter_round = depth > 0 and (lookup_branch or not looked_up)
        if looked_up and not drafter_round:  # prompt lookup found a continuation: verify it as a one-branch tree
            tokens, parents = looked_up, chain_parents(1, len(looked_up))
            drafted = refined = clock()
        elif drafter_round:
            hidden = generator._draft_forward(input_ids)
            base, vocab_ids = generator.head_scores(hidden[:, 1 : 1 + depth])
            drafted = clock()
            lead = input_ids[:, -2:].to(base.device)
            if tree_budget is None:
                tree = drafter.propose_tree(hidden, base, lead, tree_width, vocab_ids)
                tokens, parents = tree.reshape(-1).tolist(), chain_parents(*tree.shape)
            else:
                tree, parents = drafter.propose_dynamic_tree(hidden, base, lead, tree_budget, tree_width, vocab_ids)
                tokens = tree.tolist()
            if looked_up:  # lookup_branch: lookup's continuation as one more branch
                tokens, parents = add_branch(tokens, parents, looked_up)
            refined = clock()
        else:  # one token left: a plain step
            tokens, parents = [], []
        block = input_ids.new_tensor([[int(input_ids[0, -1])] + tokens])
        depths = node_depths(parents)
        proposed = max(depths, default=0)  # slots the round drafts: its deepest node (a dynamic tree: often < depth)
        positions = length - 1 + torch.tensor([0] + depths, device=block.device)
        outputs = model(
            block, position_ids=positions[None], cache=cache, use_cache=True,
            attention_mask=tree_attention_mask(parents, length - 1, model.dtype, block.device),
            **overrides,
        )
        logits = outputs.logits[0].float()
        choices = _target_choices(logits, generator, input_ids, tokens, parents, sample)
        rows, new = _walk(tokens, parents, choices.tolist())
        # Never past max_length, and nothing after the first token at which a stopping criterion fires (EOS, a stop
        # string, ...): plain `generate` checks them after every token.
        new = new[: max_length - length]
        stop = first_stop(stopping_criteria, input_ids, new[:-1])
        new, stopped = (new, False) if stop is None else (new[: stop + 1], True)  # else the loop's test checks the last
        rows = rows[: len(new)]  # the anchor and the committed drafts; the last committed token is the next anchor
        keep_cache_rows(cache, length - 1, rows)
        input_ids = torch.cat([input_ids, torch.tensor([new], dtype=input_ids.dtype, device=input_ids.device)], dim=1)
        if streamer is not None:
            streamer.put(torch.tensor([new]))
        # The drafter's context: the path's target features (`_keep_features` takes the rows it has not seen).
        generator._keep_features(input_ids, SimpleNamespace(hidden_states=tuple(
            None if h is None else h[:, rows] for h in outputs.hidden_states)))
        if proposed > 0:
            stats.draft_time += drafted - start
            stats.refine_time += refined - drafted
            passes = depth if drafter.config.refiner and drafter_round else 0  # one refiner read per slot
            generator._record_round(tokens, passes, bool(looked_up), refined, proposed=proposed)
            stats.verify_time += clock() - refined
            stats.accepted.append(len(new) - 1)
    return input_ids.to(given)


__all__ = ["DEFAULT_TREE_WIDTH", "add_branch", "chain_parents", "keep_cache_rows", "node_depths", "tree_attention_mask",
           "tree_decoding"]
