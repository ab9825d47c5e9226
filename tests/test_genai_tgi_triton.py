"""How TGI native-API and v2 inference (Triton, KServe) calls show on a span (no eBPF: the facts given)."""

from otelbpf import semconv as sc
from otelbpf.semantics.genai import genai_attributes, provider_name
from protocols.genai import LlmFacts, match_endpoint
from protocols.genai.apis import tgi, v2infer

TGI = match_endpoint("POST", "/generate_stream")
INFER = match_endpoint("POST", "/v2/models/simple/versions/2/infer")


def test_tgi_span_has_no_model():
    facts = LlmFacts(TGI, max_tokens=4, stream=True, finish_reasons=("eos_token",), input_tokens=3, output_tokens=5,
                     streamed=True, first_chunk_ns=300, last_chunk_ns=600, chunks=4)  # fmt: skip
    attrs: dict = {sc.SERVER_ADDRESS: "127.0.0.1"}
    assert genai_attributes(facts, 100, attrs) == "text_completion"
    assert attrs[sc.GEN_AI_OPERATION_NAME] == "text_completion"
    assert attrs[sc.GEN_AI_PROVIDER_NAME] == "huggingface.tgi"
    assert sc.GEN_AI_REQUEST_MODEL not in attrs and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert attrs[sc.OTELBPF_GEN_AI_RESPONSE_CHUNKS] == 4 and attrs[sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == 200 / 1e9


def test_v2_infer_span():
    facts = LlmFacts(INFER, request_model="simple", response_model="simple", response_id="r1", model_version="2",
                     inputs=2, outputs=1)  # fmt: skip
    attrs: dict = {}
    assert genai_attributes(facts, 0, attrs) == "infer simple"
    assert (attrs[sc.GEN_AI_OPERATION_NAME], attrs[sc.GEN_AI_PROVIDER_NAME]) == ("infer", "open_inference")
    assert (attrs[sc.OTELBPF_GEN_AI_REQUEST_MODEL_VERSION], attrs[sc.OTELBPF_GEN_AI_REQUEST_INPUTS],
            attrs[sc.OTELBPF_GEN_AI_RESPONSE_OUTPUTS]) == ("2", 2, 1)  # fmt: skip
    assert sc.GEN_AI_REQUEST_STREAM not in attrs and sc.GEN_AI_USAGE_INPUT_TOKENS not in attrs


def test_provider_names():
    assert provider_name("localhost", tgi.API) == "huggingface.tgi"
    assert provider_name("triton", v2infer.API) == "open_inference"
