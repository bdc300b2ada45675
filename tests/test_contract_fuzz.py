"""The OpenAPI contract, fuzzed with schemathesis against a real uvicorn server on localhost.

Bounded (``MAX_EXAMPLES`` positive and as many negative cases per operation, derandomized),
with every check schemathesis runs by default: no 5xx, every status, header and body as the
schema declares, schema-violating data refused. A failure prints the request that reproduces
it. (Driven through hypothesis directly: schemathesis' pytest plugin does not run under the
pytest this project pins.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis  # a dev dependency (pip install -e ".[dev]")
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode
from service_conftest import FakeClassifier, live_server

from dialogue_safety.service.errors import ERROR_TABLE

MAX_EXAMPLES = 150
REJECTIONS = sorted({row.status for row in ERROR_TABLE if 400 <= row.status < 500})


@pytest.fixture(scope="module")
def api_schema() -> Iterator[Any]:
    # Room enough that fuzzing never meets the admission budgets (429 is declared, not fuzzed).
    budgets = {"max_pending_tokens": 10**7, "max_explain_tokens": 10**7}
    with live_server(classifier=FakeClassifier(), **budgets) as live:
        schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
        # Schema-violating data may also be refused for its size (413): that is a rejection too.
        rejection = type(schema.config.checks.negative_data_rejection)
        schema.config.checks.negative_data_rejection = rejection(expected_statuses=REJECTIONS)
        yield schema


def operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def test_every_operation_is_fuzzed(api_schema: Any) -> None:
    labels = {op.label for op in operations(api_schema)}
    assert {"POST /v1/classify", "POST /v1/classify/batch", "GET /health", "GET /ready"} <= labels


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_the_api_keeps_its_openapi_contract(api_schema: Any, mode: GenerationMode) -> None:
    for operation in operations(api_schema):
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # no input to break: a GET without parameters has no negative case

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def keeps_the_contract(case: Any) -> None:
            body = case.body if isinstance(case.body, dict) else {}
            if mode is GenerationMode.POSITIVE and body.get("item_errors") == "fail":
                # Batch items are checked item by item (their limits are reported in their slot, so
                # the schema leaves them open); "item_errors": "fail" is the documented opt-in to
                # refuse the whole batch (422) for such an item instead: not a contract breach.
                response = case.call()
                assert response.status_code < 500 and response.status_code in (200, 422, 429), response.text
                return
            if mode is GenerationMode.POSITIVE and case.operation.path.endswith("/conversation"):
                # /v1/classify/conversation judges every turn, so each needs visible text, and takes messages or
                # turns, exactly one; its schema shares history's turn shape (where an empty turn is context) and
                # cannot say "one of": those refusals are the documented 422s. Every other answer is validated.
                response = case.call()
                refused = {"invalid_request", "invalid_message", "empty_utterance"}
                if response.status_code == 422 and response.json()["error"]["code"] in refused:
                    return
                case.validate_response(response)
                return
            if mode is GenerationMode.POSITIVE and any(
                isinstance(body.get(k), list) for k in ("messages", "conversation")
            ):
                # The schema leaves a message's `content` optional (an assistant's tool call has none) and cannot
                # say which roles may omit it, nor that some user or assistant message must have text to judge:
                # such a transcript is refused by the documented rule (422 invalid_message, docs/api.md). Every
                # other answer is validated as usual.
                response = case.call()
                # (422 on our routes; 400 in OpenAI's shape on /v1/moderations' conversation)
                if response.status_code in (400, 422) and response.json()["error"]["code"] == "invalid_message":
                    return
                case.validate_response(response)
                return
            case.call_and_validate()

        keeps_the_contract()
