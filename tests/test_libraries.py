"""Models from other libraries train through `LossFromModel`, without step methods of
their own: Hugging Face transformers (a causal language model, a sequence classifier, a
token classifier), PEFT, and datasets with its collators. ember's run ends with the
weights and metric values of a hand-written loop with the same seed; its checkpoints
hold the model's own parameter names, load into a bare model and resume exactly; a
trained model saves and loads with `save_pretrained` / `from_pretrained`. Last, what is
refused and how. (torch_geometric, diffusers, detection, timm and torchvision:
test_libraries_vision_graphs.py.)"""

from __future__ import annotations

import copy
import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from library_testing import (
    assert_checkpoint_loads_into,
    assert_close_states,
    builder,
    fit_history,
    hand_loop,
    library,
    quiet,
    train_losses,
)
from torch import nn

import ember
from ember.data import DataLoaderBuilder
from ember.errors import ConfigError, TrainingError
from ember.train import ClassificationOutput, EvaluatorBuilder, LossFromModel, TrainOutput
from ember.train.metric import AccuracyMetric, LossMetric, PerplexityMetric
from ember.train.renderer import PlainRenderer

# --- Hugging Face: a causal language model ----------------------------------------------------


def word_tokenizer(hf: Any) -> Any:
    """A word-level tokenizer made in memory (nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "big", "small", "red"]
    vocab = {"[PAD]": 0, "[UNK]": 1, **{word: i + 2 for i, word in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return hf.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]"
    )


def sentences(count: int, seed: int) -> tuple[list[str], list[int]]:
    """Random sentences of 3 to 9 words, labelled 1 when they mention a cat."""
    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "big", "small", "red"]
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 10, (count,), generator=generator).tolist()
    texts = [
        " ".join(words[int(i)] for i in torch.randint(0, len(words), (n,), generator=generator))
        for n in lengths
    ]
    return texts, [int("cat" in text.split()) for text in texts]


def tokenized(hf: Any, tokenizer: Any, count: int, seed: int) -> Any:
    datasets = library("datasets")
    datasets.disable_progress_bars()
    texts, labels = sentences(count, seed)
    data = datasets.Dataset.from_dict({"text": texts, "label": labels})
    return data.map(lambda rows: tokenizer(rows["text"]), batched=True, remove_columns=["text"])


def gpt2(hf: Any, tokenizer: Any) -> Any:
    config = hf.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        use_cache=False,
    )
    return hf.GPT2LMHeadModel(config)


def lm_loaders(hf: Any, tokenizer: Any) -> tuple[Any, Any]:
    """Shuffled training batches and validation batches, padded by the collator (labels
    of padding -100)."""
    collator = hf.DataCollatorForLanguageModeling(tokenizer, mlm=False)
    train = tokenized(hf, tokenizer, 24, seed=1).remove_columns(["label"])
    valid = tokenized(hf, tokenizer, 12, seed=2).remove_columns(["label"])
    return (
        DataLoaderBuilder(collator).batch_size(6).shuffle(3).build(train),
        DataLoaderBuilder(collator).batch_size(6).build(valid),
    )


def test_a_causal_lm_trains_as_a_hand_loop_with_shifted_token_metrics(tmp_path, one_thread):
    hf = quiet(library("transformers"))
    tokenizer = word_tokenizer(hf)
    torch.manual_seed(0)
    initial = gpt2(hf, tokenizer)
    hand, ours = copy.deepcopy(initial), copy.deepcopy(initial)

    torch.manual_seed(7)
    train, _ = lm_loaders(hf, tokenizer)
    expected = hand_loop(
        hand, torch.optim.SGD(hand.parameters(), lr=0.5), train, 2, lambda m, b: m(**b).loss
    )

    ember.seed(7)
    train, valid = lm_loaders(hf, tokenizer)
    metrics = (LossMetric(), AccuracyMetric(), PerplexityMetric())
    learner = builder(tmp_path / "run", valid=metrics).build(
        ours, torch.optim.SGD(ours.parameters(), lr=0.5), steps=LossFromModel("causal_lm")
    )
    assert learner.fit(train, valid) is ours  # the model itself, not a wrapper

    # The loss is a mean over tokens: ember weighs the gradient by them and back, which
    # rounds differently from loss.backward() in the last bits.
    assert_close_states(ours, hand, atol=1e-6)
    assert not torch.equal(ours.lm_head.weight, initial.lm_head.weight)
    logged = train_losses(tmp_path / "run", 1) + train_losses(tmp_path / "run", 2)
    assert logged == pytest.approx(expected, abs=1e-6)

    # The validation metrics read logits[:, :-1] against labels[:, 1:], padding (-100) out.
    nll = tokens = hits = 0.0
    ours.eval()
    with torch.no_grad():
        for batch in valid:
            logits, labels = ours(**batch).logits[:, :-1], batch["labels"][:, 1:]
            kept = labels != -100
            nll += float(F.cross_entropy(logits[kept], labels[kept], reduction="sum"))
            hits += float((logits.argmax(-1)[kept] == labels[kept]).sum())
            tokens += float(kept.sum())
    values = learner.history[-1][1]["valid"]
    assert values["Loss"] == pytest.approx(nll / tokens, rel=1e-6)
    assert values["Perplexity"] == pytest.approx(math.exp(nll / tokens), rel=1e-6)
    assert values["Accuracy"] == pytest.approx(100 * hits / tokens, rel=1e-9)


def test_a_causal_lm_checkpoint_is_the_bare_models_and_resumes_exactly(tmp_path, one_thread):
    hf = quiet(library("transformers"))
    tokenizer = word_tokenizer(hf)

    def fit(directory: Path, **options: Any) -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = gpt2(hf, tokenizer)
        ember.seed(7)
        learner = builder(
            directory, valid=(PerplexityMetric(),), checkpoints=True, **options
        ).build(
            model, torch.optim.AdamW(model.parameters(), lr=1e-2), steps=LossFromModel("causal_lm")
        )
        return learner.fit(*lm_loaders(hf, tokenizer)), learner

    straight, _ = fit(tmp_path / "straight")
    _, stopped = fit(tmp_path / "resumed", stop=(1, 2))
    assert stopped.outcome == "stopped: test stop"
    resumed, learner = fit(tmp_path / "resumed", resume=True)
    assert learner.outcome == "completed"
    assert_close_states(resumed, straight)
    assert (
        "Resumed from the checkpoint of epoch 1, iteration 2."
        in (tmp_path / "resumed" / "experiment.log").read_text()
    )

    assert_checkpoint_loads_into(tmp_path / "straight", 2, gpt2(hf, tokenizer), straight)

    straight.save_pretrained(tmp_path / "saved")
    again = hf.GPT2LMHeadModel.from_pretrained(tmp_path / "saved")
    assert_close_states(again, straight)

    # A model loaded on its own gets the steps with attach, and evaluates as validation did.
    evaluator = (
        EvaluatorBuilder(tmp_path / "evaluation")
        .metric(PerplexityMetric())
        .renderer(PlainRenderer(interval=3600, stream=io.StringIO()))
        .build(LossFromModel("causal_lm").attach(again))
    )
    tested = evaluator.eval("valid", lm_loaders(hf, tokenizer)[1])
    valid = fit_history(tmp_path / "straight")[-1][1]["valid"]
    assert tested["Perplexity"] == pytest.approx(valid["Perplexity"], rel=1e-6)


# --- Hugging Face: sequence classification, datasets and a padding collator --------------------


def bert(hf: Any, tokenizer: Any) -> Any:
    config = hf.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    return hf.BertForSequenceClassification(config)


def test_a_sequence_classifier_trains_as_a_hand_loop_bit_for_bit(tmp_path, one_thread):
    hf = quiet(library("transformers"))
    tokenizer = word_tokenizer(hf)
    collator = hf.DataCollatorWithPadding(tokenizer)
    train_set, valid_set = tokenized(hf, tokenizer, 30, 1), tokenized(hf, tokenizer, 12, 2)

    def loaders() -> tuple[Any, Any]:
        return (
            DataLoaderBuilder(collator).batch_size(8).shuffle(3).build(train_set),
            DataLoaderBuilder(collator).batch_size(8).build(valid_set),
        )

    torch.manual_seed(0)
    initial = bert(hf, tokenizer)
    hand, ours = copy.deepcopy(initial), copy.deepcopy(initial)
    torch.manual_seed(5)
    expected = hand_loop(
        hand,
        torch.optim.Adam(hand.parameters(), lr=1e-2),
        loaders()[0],
        2,
        lambda m, b: m(**b).loss,
    )

    ember.seed(5)
    train, valid = loaders()
    learner = builder(
        tmp_path / "run", valid=(LossMetric(), AccuracyMetric()), checkpoints=True
    ).build(
        ours,
        torch.optim.Adam(ours.parameters(), lr=1e-2),
        steps=LossFromModel("classification"),
    )
    learner.fit(train, valid)
    assert_close_states(ours, hand)
    assert not torch.equal(ours.classifier.weight, initial.classifier.weight)
    assert train_losses(tmp_path / "run", 1) + train_losses(tmp_path / "run", 2) == expected

    ours.eval()
    with torch.no_grad():
        batches = list(valid)
        hits = sum(int((ours(**b).logits.argmax(-1) == b["labels"]).sum()) for b in batches)
    assert learner.history[-1][1]["valid"]["Accuracy"] == pytest.approx(100 * hits / 12)
    assert_checkpoint_loads_into(tmp_path / "run", 2, bert(hf, tokenizer), ours)

    predicted = learner.predict(valid)  # the logits of every validation sample
    with torch.no_grad():
        assert torch.equal(predicted, torch.cat([ours(**b).logits for b in batches]))


def test_token_classification_reads_one_label_per_token_without_padding(tmp_path):
    hf = quiet(library("transformers"))
    tokenizer = word_tokenizer(hf)
    collator = hf.DataCollatorForTokenClassification(tokenizer)
    cat = tokenizer.convert_tokens_to_ids("cat")

    def tagged(count: int, seed: int) -> Any:  # each token tagged 1 when it is "cat"
        data = tokenized(hf, tokenizer, count, seed).remove_columns(["label"])
        return data.map(lambda row: {"labels": [int(i == cat) for i in row["input_ids"]]})

    train = DataLoaderBuilder(collator).batch_size(8).shuffle(0).build(tagged(24, 1))
    valid = DataLoaderBuilder(collator).batch_size(5).build(tagged(10, 2))
    torch.manual_seed(0)
    model = hf.BertForTokenClassification(bert(hf, tokenizer).config)
    learner = builder(tmp_path / "run", valid=(LossMetric(), AccuracyMetric())).build(
        model, torch.optim.Adam(model.parameters(), lr=1e-2), steps=LossFromModel("tokens")
    )
    learner.fit(train, valid)
    nll = hits = tokens = 0.0
    model.eval()
    with torch.no_grad():
        for batch in valid:
            logits, labels = model(**batch).logits, batch["labels"]
            kept = labels != -100  # the collator pads the labels with -100
            nll += float(F.cross_entropy(logits[kept], labels[kept], reduction="sum"))
            hits += float((logits.argmax(-1)[kept] == labels[kept]).sum())
            tokens += float(kept.sum())
    assert tokens < sum(b["labels"].numel() for b in valid)  # there was padding to leave out
    values = learner.history[-1][1]["valid"]
    assert values["Loss"] == pytest.approx(nll / tokens, rel=1e-6)
    assert values["Accuracy"] == pytest.approx(100 * hits / tokens, rel=1e-9)


# --- PEFT: LoRA adapters -----------------------------------------------------------------------


def test_lora_trains_as_a_hand_loop_and_saves_only_its_adapters(tmp_path, one_thread):
    hf = quiet(library("transformers"))
    peft = library("peft")
    tokenizer = word_tokenizer(hf)

    def lora(base: nn.Module) -> Any:
        config = peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True)
        return peft.get_peft_model(base, config)

    torch.manual_seed(0)
    base = gpt2(hf, tokenizer)
    hand, ours = lora(copy.deepcopy(base)), lora(copy.deepcopy(base))
    ours.load_state_dict(hand.state_dict())  # the same adapter initialisation
    trainable = [name for name, p in ours.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)

    def trainable_params(model: nn.Module) -> list[nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    torch.manual_seed(7)
    train, _ = lm_loaders(hf, tokenizer)
    hand_loop(
        hand, torch.optim.SGD(trainable_params(hand), lr=0.5), train, 2, lambda m, b: m(**b).loss
    )
    ember.seed(7)
    learner = builder(tmp_path / "run", valid=(LossMetric(),), checkpoints=True).build(
        ours, torch.optim.SGD(trainable_params(ours), lr=0.5), steps=LossFromModel("causal_lm")
    )
    learner.fit(*lm_loaders(hf, tokenizer))
    assert_close_states(ours, hand, atol=1e-6)
    assert all(p.abs().sum() > 0 for n, p in ours.named_parameters() if "lora_B" in n)

    fresh = lora(copy.deepcopy(base))
    assert_checkpoint_loads_into(tmp_path / "run", 2, fresh, ours)

    ours.save_pretrained(tmp_path / "adapters")
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    assert saved and all("lora_" in name for name in saved)
    again = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "adapters")
    assert_close_states(again, ours)


# --- what is refused, and how ------------------------------------------------------------------


def test_a_model_without_steps_is_pointed_to_the_adapter(tmp_path):
    with pytest.raises(TrainingError, match=r"Linear has no train_step method.*LossFromModel"):
        builder(tmp_path / "run").build(
            nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        )


def test_steps_are_refused_for_a_model_with_its_own(tmp_path):
    class Own(nn.Linear):
        def train_step(self, batch):
            return TrainOutput(ClassificationOutput(self(batch).sum(), batch, batch))

    model = Own(2, 2)
    with pytest.raises(ConfigError, match=r"Own defines its own train_step"):
        builder(tmp_path / "run").build(
            model, torch.optim.SGD(model.parameters(), lr=0.1), steps=LossFromModel()
        )


def test_options_that_cannot_work_are_refused_when_made():
    with pytest.raises(ConfigError, match=r"task='lm'"):
        LossFromModel("lm")
    with pytest.raises(ConfigError, match=r"needs loss="):
        LossFromModel("classification", mask="train_mask")
    with pytest.raises(ConfigError, match=r"valid_loss='train'"):
        LossFromModel(valid_loss="train")


class Logits(nn.Linear):
    """A model whose forward takes the labels and returns logits only."""

    def forward(self, x, labels=None):
        return super().forward(x)


def test_a_forward_without_a_loss_says_how_to_give_one(tmp_path):
    model = Logits(3, 2)
    batches = [(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))]
    learner = builder(tmp_path / "run").build(
        model, torch.optim.SGD(model.parameters(), lr=0.1), steps=LossFromModel("classification")
    )
    with pytest.raises(TrainingError, match=r"no loss.*LossFromModel\(loss=\.\.\.\)"):
        learner.fit(batches)
    model = nn.Linear(3, 2)  # a forward of the inputs alone
    learner = builder(tmp_path / "run").build(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        steps=LossFromModel("classification", loss=F.cross_entropy),
    )
    learner.fit(batches)  # with loss=, a tuple's last element is the targets, kept from forward
    assert learner.outcome == "completed"
