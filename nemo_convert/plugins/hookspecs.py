"""Hook specifications of nemo-convert.

A plugin is a module (or object) registered under the ``nemo_convert`` entry-point group
that implements one or more of these hooks, marked with :data:`hookimpl`::

    # pyproject.toml of your distribution
    [project.entry-points.nemo_convert]
    mistral = "nemo_convert_mistral"

Each hook returns a list of typed records (:mod:`nemo_convert.plugins.records`). The core
collects the records of every plugin; two records with one name are an error naming both
distributions.
"""

from __future__ import annotations

import pluggy

from nemo_convert.plugins.records import ModelFamily, OutputTarget, ShardingStrategy, TokenizerPatcher, Verifier

PROJECT = "nemo_convert"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def nemo_convert_model_families() -> list[ModelFamily]:
    """Return the model families this plugin provides.

    A family maps one kind of Hugging Face model onto one kind of NeMo model: which
    ``config.json`` it handles, the key mapping as data (renames and semantic ops, each
    with its inverse), and the config translation both ways. The core does every tensor
    operation, the planning, the streaming and the file formats.

    :return: a list of :class:`~nemo_convert.plugins.records.ModelFamily`.

    .. versionadded:: 0.1

    Example::

        from nemo_convert import hookimpl, ModelFamily
        from nemo_convert.mapping import Mapping, Rename, FuseQKV, FuseGated

        def _mapping(cfg):
            return Mapping(rules=(
                Rename("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
                FuseQKV(q="model.layers.{i}.self_attn.q_proj.weight",
                        k="model.layers.{i}.self_attn.k_proj.weight",
                        v="model.layers.{i}.self_attn.v_proj.weight",
                        nemo="decoder.layers.{i}.self_attention.linear_qkv.weight"),
                # ...
            ))

        @hookimpl
        def nemo_convert_model_families():
            return [ModelFamily(name="mistral", hf_architectures=("MistralForCausalLM",),
                                hf_model_types=("mistral",),
                                nemo=NemoTarget("nemo.collections.nlp.models.language_modeling."
                                                "megatron_gpt_model.MegatronGPTModel"),
                                mapping=_mapping, config_to_nemo=..., config_to_hf=...)]
    """
    raise NotImplementedError


@hookspec
def nemo_convert_tokenizer_patchers() -> list[TokenizerPatcher]:
    """Return the tokenizer patchers this plugin provides.

    A patcher adds tokens to one kind of tokenizer (SentencePiece ``.model``, an HF
    ``tokenizer.json`` folder, …). ``nemo-convert tokenizer add-tokens`` picks the first
    patcher whose ``detect(path)`` is true.

    :return: a list of :class:`~nemo_convert.plugins.records.TokenizerPatcher`.

    .. versionadded:: 0.1

    Example::

        @hookimpl
        def nemo_convert_tokenizer_patchers():
            return [TokenizerPatcher(name="tiktoken", detect=lambda p: p.endswith(".tiktoken"),
                                     add_tokens=_add_tiktoken_tokens)]
    """
    raise NotImplementedError


@hookspec
def nemo_convert_sharding_strategies() -> list[ShardingStrategy]:
    """Return the sharding strategies this plugin provides.

    A strategy turns a global tensor and its declared parallel kind (column, row,
    replicated, vocab, grouped QKV, gated fc1, …) into per-rank slices and back (``"tp"``),
    lays layers out in pipeline stages (``"pp"``), or places experts on ranks (``"ep"``);
    its implementation satisfies the axis's protocol in
    :mod:`nemo_convert.sharding.protocol` (checked when the registry is built). Every
    reader and writer of a sharded layout uses the registered strategy of each axis; the
    built-in tensor, pipeline and expert parallelism are registered through this hook.

    :return: a list of :class:`~nemo_convert.plugins.records.ShardingStrategy`.

    .. versionadded:: 0.1

    Example::

        @hookimpl
        def nemo_convert_sharding_strategies():
            return [ShardingStrategy(name="expert", axis="ep", implementation=MyExperts())]
    """
    raise NotImplementedError


@hookspec
def nemo_convert_verifiers() -> list[Verifier]:
    """Return the extra checks this plugin adds to ``verify``.

    A verifier declares the ``verify`` options it reads (the CLI adds them to the command)
    and a function run on both checkpoints as HF folders when one of them is given; its
    result is reported beside the tensor, config and tokenizer comparison.

    :return: a list of :class:`~nemo_convert.plugins.records.Verifier`.

    .. versionadded:: 0.1

    Example::

        @hookimpl
        def nemo_convert_verifiers():
            return [Verifier(name="clip", run=zero_shot_report, check=check_zero_shot_options,
                             options=(CommandOption("verify", "--clip-image", "the image", kind="value"),
                                      CommandOption("verify", "--texts", "captions", kind="values")))]
    """
    raise NotImplementedError


@hookspec
def nemo_convert_targets() -> list[OutputTarget]:
    """Return the output targets this plugin provides.

    A target is something ``import``, ``reshard`` and ``from-ckpt`` can write (``--to
    NAME``): its name, the output kind ``--overwrite`` checks, which target-specific
    options it honours (``layout``, ``packed``, ``workers``), and ``write(job)``, which
    writes the planned tensors and the config of an
    :class:`~nemo_convert.plugins.records.OutputJob`. Each conversion opens its source,
    picks the family and plans; then one step checks the target and calls its writer, so
    a new target reaches every conversion (and every family) with no core edit. The
    built-in ``nemo`` and ``megatron-bridge`` targets are registered through this hook.

    :return: a list of :class:`~nemo_convert.plugins.records.OutputTarget`.

    .. versionadded:: 0.1

    Example::

        @hookimpl
        def nemo_convert_targets():
            return [OutputTarget(name="flat", kind="hf", write=write_flat_folder,
                                 description="one safetensors file of NeMo-named tensors")]
    """
    raise NotImplementedError
