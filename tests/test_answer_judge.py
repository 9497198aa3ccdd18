"""The strict answer judge: known false positives of the old substring match, true positives,
accepted spellings, the other question kinds, and the Wilson interval."""

import pytest

from stream2llm.data.answer_judge import is_refusal, judge, normalize, wilson_interval
from stream2llm.data.corpus import GroundedQuestion, load_question_set


def capital(country: str, answer: str, *accepted: str) -> GroundedQuestion:
    return GroundedQuestion(country, answer, country.replace(" ", "_"), "capital", accepted)


# Answers the committed qa.json scored as correct with "the capital appears in the answer".
FALSE_POSITIVES = [
    (capital("Guinea-Bissau", "Bissau"), "The capital of Guinea-Bissau is Conakry. Conakry is the capital and "
                                         "largest city of Guinea", "other_candidate"),
    (capital("Singapore", "Singapore"), "The capital of Singapore is not explicitly mentioned in the document. "
                                        "The document only mentions the country's territory", "refusal"),
    (capital("Vatican City", "Vatican City"), "The capital of Vatican City is Rome.", "other_candidate"),
    (capital("São Tomé and Príncipe", "São Tomé"),
     "São Tomé and Príncipe is the capital of São Tomé and Príncipe.\n\nThe document", "echo_only"),
    (capital("Singapore", "Singapore"), "Singapore", "echo_only"),
    (capital("Brazil", "Brasília"), "I don't know the capital of Brazil.", "refusal"),
    (capital("Brazil", "Brasília"), "Rio de Janeiro", "not_named"),
]

TRUE_POSITIVES = [
    (capital("Ukraine", "Kyiv"), "The capital of Ukraine is Kyiv."),
    (capital("Ukraine", "Kyiv"), "The capital of Ukraine is Kiev."),
    (capital("Moldova", "Chișinău"), "It is CHISINAU."),
    (capital("Brazil", "Brasília"), "The capital is Brasilia."),
    (capital("Guinea-Bissau", "Bissau"), "The capital of Guinea-Bissau is Bissau."),
    (capital("São Tomé and Príncipe", "São Tomé"), "The capital of Sao Tome and Principe is Sao Tome."),
    (capital("Singapore", "Singapore"), "The capital of Singapore is Singapore, a city-state."),
    (capital("Haiti", "Port-au-Prince"), "Port au Prince"),
    (capital("Mongolia", "Ulan Bator"), "Ulaanbaatar is the capital of Mongolia."),
    (capital("South Africa", "Pretoria", "Bloemfontein", "Cape Town"), "Pretoria (executive), Cape Town and Bloemfontein"),
    (capital("Kuwait", "Kuwait City"), "Kuwait City."),
]


@pytest.mark.parametrize("question,answer,reason", FALSE_POSITIVES)
def test_known_false_positives_are_wrong(question, answer, reason):
    verdict = question.verdict(answer)
    assert not verdict.correct and verdict.reason == reason, verdict


@pytest.mark.parametrize("question,answer", TRUE_POSITIVES)
def test_true_positives_and_accepted_spellings(question, answer):
    verdict = question.verdict(answer)
    assert verdict.correct, verdict


def test_other_kinds_judge_by_the_same_rules():
    border = GroundedQuestion("Cameroon", "Chad", "Cameroon", "border",
                              ("Nigeria", "Central African Republic", "Congo", "Gabon", "Equatorial Guinea"))
    assert border.question.startswith("Name a country that shares a land border with Cameroon")
    assert border.answered_by("Equatorial Guinea")  # the longest name, not "Guinea" (not a neighbour)
    assert border.answered_by("Cameroon borders Nigeria.")
    assert not border.answered_by("Nigeria, Ghana and Chad")  # a guessed list with a wrong country
    assert not border.answered_by("Cameroon")
    niger = GroundedQuestion("Nigeria", "Niger", "Nigeria", "border", ("Benin", "Chad", "Cameroon"))
    assert niger.answered_by("Niger") and not niger.answered_by("Nigeria is in West Africa.")
    language = GroundedQuestion("Switzerland", "German", "Switzerland", "language", ("French", "Italian", "Romansh"))
    assert language.answered_by("German, French, Italian and Romansh")
    assert not language.answered_by("Swiss German and English")  # English is not official there
    assert not language.answered_by("The document does not mention the languages.")


def test_question_set_has_three_grounded_kinds():
    questions = load_question_set()
    kinds = {q.kind for q in questions}
    assert kinds == {"capital", "border", "language"}
    assert sum(q.kind == "capital" for q in questions) == 152
    assert min(sum(q.kind == k for q in questions) for k in kinds) >= 40
    for q in questions:  # the question echoed, then its expected answer: correct; the echo alone: not
        assert q.answered_by(f"{q.question} {q.answer}."), q
        assert not q.answered_by(q.question), q


def test_normalize_and_refusals():
    assert normalize("Port-au-Prince, N'Djamena!") == "port au prince ndjamena"
    for text in ("It is not mentioned.", "The document doesn't say.", "I cannot determine that.", "", "Unknown."):
        assert is_refusal(text), text
    assert not is_refusal("Paris is the capital; the text notes it.")
    with pytest.raises(ValueError):
        judge("Paris", accepted=[], subject=["France"])


def test_wilson_interval():
    low, high = wilson_interval(196, 304)
    assert low < 196 / 304 < high and 0.58 < low < 0.60 and 0.69 < high < 0.70
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # the textbook value
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(11, 10)
