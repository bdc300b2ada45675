"""The naive alternative the HTTP benchmark compares against.

A FastAPI endpoint that calls transformers' ``pipeline("text-classification")`` on the torch
checkpoint, one request at a time (the handler runs the model on the event loop: no batching,
no ONNX). Same request shape as ``POST /v1/classify``; history and utterance go in as a text
pair. Needs the ``train`` extra (torch, transformers)::

    python -m lab.bench.naive_service --checkpoint DIR --port 8001
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response


def create_app(checkpoint_dir: str | Path) -> FastAPI:
    from transformers import BertForSequenceClassification, PreTrainedTokenizerFast, pipeline

    from dialogue_safety.core.model_card import TOKENIZER_FILE, ModelCard

    src = Path(checkpoint_dir)
    card = ModelCard.load(src)
    model = BertForSequenceClassification.from_pretrained(str(src))
    model.eval()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(src / TOKENIZER_FILE),
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        model_max_length=int(card.encoding.get("max_length", 128)),
    )
    classify_text = pipeline(
        "text-classification", model=model, tokenizer=tokenizer, device=-1, function_to_apply="sigmoid", top_k=None
    )
    model_id = card.model_id
    app = FastAPI(title="naive dialogue safety baseline")

    @app.post("/v1/classify")
    async def classify(request: Request) -> Response:
        body: dict[str, Any] = json.loads(await request.body())
        history = [h if isinstance(h, str) else h.get("text", "") for h in body.get("history", [])]
        utterance = str(body["utterance"])
        inputs: Any = {"text": " ".join(history), "text_pair": utterance} if history else utterance
        scores = classify_text(inputs, truncation=True)
        rows = scores[0] if scores and isinstance(scores[0], list) else scores
        score = max(float(r["score"]) for r in rows)
        label = "OFFENSIVE" if score >= card.threshold else "SAFE"
        return JSONResponse({"label": label, "score": score, "threshold": card.threshold, "model": model_id})

    @app.get("/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready", "model": model_id}

    return app


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench.naive_service") -> int:
    p = argparse.ArgumentParser(prog=prog, description="naive transformers-pipeline service (benchmark baseline)")
    p.add_argument("--checkpoint", required=True, type=Path, help="torch checkpoint directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    args = p.parse_args(argv)
    import uvicorn

    uvicorn.run(create_app(args.checkpoint), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
