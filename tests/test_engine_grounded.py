"""SmolLM2 answers a grounded geography question from streamed Wikipedia summaries."""

from engine.api import SamplingConfig
from engine.prompt import ContextDoc, RagPrompt
from stream2llm.data.corpus import documents_by_id, load_grounded_questions
from tests.conftest import collect


async def test_streamed_summaries_give_grounded_answer(smol_engine):
    question = next(q for q in load_grounded_questions() if q.country == "France")
    docs = documents_by_id()
    context = [docs["Germany"], docs[question.doc_id], docs["Italy"]]
    prompt = RagPrompt(smol_engine.tokenizer)
    sid = await smol_engine.open_session()
    await smol_engine.append(sid, token_ids=prompt.header_ids())
    for doc in context:
        await smol_engine.append(sid, token_ids=prompt.doc_ids(ContextDoc(doc.doc_id, doc.title, doc.text)))
    ids, text = await collect(smol_engine.finish(sid, token_ids=prompt.footer_ids(question.question),
                                                 sampling=SamplingConfig(max_tokens=32)))
    assert question.capital in text, text
