"""The model's own output for each text, computed one text at a time, without the workflow."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer


def _encode(tokenizer, text: str, max_length: int) -> dict:
    return tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")


@torch.no_grad()
def classify(model_path, texts, max_length: int, adapter=None) -> tuple[np.ndarray, np.ndarray]:
    """(label ids, probabilities) per text; with `adapter`, peft's own PeftModel (unmerged)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_path)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    probs = np.stack([torch.softmax(model(**_encode(tokenizer, t, max_length)).logits[0], -1).numpy() for t in texts])
    return probs.argmax(axis=1), probs


@torch.no_grad()
def embed(model_path, texts, max_length: int, normalize: bool = False) -> np.ndarray:
    """Mean of the last hidden states over each text's tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).eval()
    vectors = np.stack([model(**_encode(tokenizer, t, max_length)).last_hidden_state[0].mean(0).numpy() for t in texts])
    if normalize:
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors
