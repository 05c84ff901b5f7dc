"""Write the fine-tuning fixtures: small SQuAD v1.1 / v2.0 train and dev files in the official layout.

    python tests/data/squad/make_finetune_fixtures.py      # rewrites the four *-finetune.json files

The paragraphs are original English prose written for these tests (facts about the Danube, Marie
Curie, the Eiffel Tower, Sao Paulo and photosynthesis). They are built to exercise what the real
files do: long contexts that need several windows at a small max_seq_length, answers with
punctuation, numbers, quotes, articles, non-ASCII letters (normalisation), several gold answers per
dev question, and (v2.0) unanswerable questions with plausible answers.

Train files carry one answer per answerable question (as SQuAD's train files); the dev files ask
the same questions with one to three gold answers each, so a model that memorises the training
questions scores high on them (the end-to-end test measures exactly that).
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

DANUBE = (
    "The Danube is the second-longest river in Europe, after the Volga in Russia. It flows through much of "
    "Central and Southeastern Europe, from the Black Forest in Germany into the Black Sea. Originating in the "
    "town of Donaueschingen, the river flows southeast for about 2,850 km (1,770 mi), passing through or along "
    "the borders of ten countries, more than any other river in the world: Germany, Austria, Slovakia, Hungary, "
    "Croatia, Serbia, Romania, Bulgaria, Moldova and Ukraine. Four capital cities stand on its banks: Vienna, "
    "Bratislava, Budapest and Belgrade. A long stretch of the river formed a frontier of the Roman Empire, and "
    "the Romans called it the Danubius. Today the Danube is an important waterway for barges carrying grain, "
    "ore and coal, and it is linked to the Rhine by the Main\u2013Danube Canal, which was opened in 1992. The "
    "river ends in a large delta in Romania and Ukraine, a wetland that is home to more than three hundred "
    "species of birds.")

CURIE = (
    "Marie Sk\u0142odowska Curie was a Polish and naturalised-French physicist and chemist who conducted "
    "pioneering research on radioactivity. She was the first woman to win a Nobel Prize, the first person to "
    "win a Nobel Prize twice, and the only person to win a Nobel Prize in two scientific fields. She shared the "
    "1903 Nobel Prize in Physics with her husband Pierre Curie and the physicist Henri Becquerel, and she won "
    "the 1911 Nobel Prize in Chemistry for the discovery of the elements polonium and radium. She named "
    "polonium after Poland, her native country. During the First World War she developed mobile radiography "
    "units, known as \"petites Curies\", to provide X-ray services to field hospitals.")

EIFFEL = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower between 1887 and 1889 as the "
    "entrance arch to the 1889 World's Fair. Although it was criticised by some of France's leading artists and "
    "intellectuals for its design, it has become a global cultural icon of France. The tower is 330 metres "
    "(1,083 ft) tall, about the same height as an 81-storey building. It was the tallest man-made structure in "
    "the world until the Chrysler Building in New York City was finished in 1930.")

SAO_PAULO = (
    "S\u00e3o Paulo is the most populous city in Brazil and the largest city in the Southern Hemisphere. "
    "Founded by Jesuit priests in 1554, it grew rapidly in the late nineteenth century when coffee became the "
    "country's main export. The city is home to the Museu de Arte de S\u00e3o Paulo, which is famous for its "
    "building raised on four red pillars above a large open plaza.")

PHOTO = (
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light energy into "
    "chemical energy. During photosynthesis, light energy is captured by chlorophyll, a green pigment found in "
    "chloroplasts, and used to turn water and carbon dioxide into glucose. Oxygen is released as a by-product. "
    "In most plants, photosynthesis takes place mainly in the leaves, whose cells contain many chloroplasts. "
    "The oxygen in Earth's atmosphere comes almost entirely from photosynthesis, which is why the process is "
    "essential for most life on the planet.")

# (id, question, train answer, extra dev golds)
V11 = [
    ("Danube", DANUBE, [
        ("dan-1", "Which river in Europe is longer than the Danube?", "the Volga", ["Volga"]),
        ("dan-2", "Where does the Danube begin?", "the Black Forest in Germany", ["Black Forest", "the Black Forest"]),
        ("dan-3", "In which town does the river originate?", "Donaueschingen", []),
        ("dan-4", "How long is the Danube?", "2,850 km (1,770 mi)", ["about 2,850 km", "2,850 km"]),
        ("dan-5", "Which four capital cities lie on the Danube?", "Vienna, Bratislava, Budapest and Belgrade", []),
        ("dan-6", "What did the Romans call the river?", "the Danubius", ["Danubius"]),
        ("dan-7", "When was the Main\u2013Danube Canal opened?", "1992", ["in 1992"]),
        ("dan-8", "How many species of birds live in the delta?", "more than three hundred",
         ["three hundred", "more than three hundred species"]),
    ]),
    ("Marie_Curie", CURIE, [
        ("cur-1", "What field of research did Curie pioneer?", "radioactivity", []),
        ("cur-2", "Who shared the 1903 Nobel Prize in Physics with Marie Curie?",
         "her husband Pierre Curie and the physicist Henri Becquerel", ["Pierre Curie and the physicist Henri Becquerel"]),
        ("cur-3", "In which year did Curie win the Nobel Prize in Chemistry?", "1911", []),
        ("cur-4", "Which elements did she discover?", "polonium and radium", []),
        ("cur-5", "After which country did she name polonium?", "Poland", ["Poland, her native country"]),
        ("cur-6", "What were her mobile radiography units called?", "petites Curies", ["\"petites Curies\""]),
    ]),
    ("Eiffel_Tower", EIFFEL, [
        ("eif-1", "What is the Eiffel Tower made of?", "wrought-iron", ["wrought-iron lattice", "a wrought-iron lattice tower"]),
        ("eif-2", "Where in Paris is the tower located?", "the Champ de Mars", ["Champ de Mars"]),
        ("eif-3", "Who was the tower named after?", "Gustave Eiffel", ["the engineer Gustave Eiffel"]),
        ("eif-4", "How tall is the Eiffel Tower?", "330 metres (1,083 ft)", ["330 metres"]),
        ("eif-5", "Which building surpassed the tower as the tallest man-made structure?", "the Chrysler Building",
         ["Chrysler Building"]),
        ("eif-6", "For what event was the tower built?", "the 1889 World's Fair", ["1889 World's Fair"]),
    ]),
    ("S\u00e3o_Paulo", SAO_PAULO, [
        ("sao-1", "Who founded S\u00e3o Paulo?", "Jesuit priests", []),
        ("sao-2", "When was Sao Paulo founded?", "1554", ["in 1554"]),
        ("sao-3", "What made the city grow in the late nineteenth century?", "coffee", []),
        ("sao-4", "What is the art museum of the city called?", "Museu de Arte de S\u00e3o Paulo",
         ["the Museu de Arte de S\u00e3o Paulo"]),
    ]),
    ("Photosynthesis", PHOTO, [
        ("pho-1", "What pigment captures light energy?", "chlorophyll", []),
        ("pho-2", "What is released as a by-product of photosynthesis?", "Oxygen", []),
        ("pho-3", "Where does photosynthesis mainly take place in most plants?", "in the leaves", ["the leaves", "leaves"]),
        ("pho-4", "Which two substances are turned into glucose?", "water and carbon dioxide", []),
    ]),
]

# v2.0: answerable questions plus unanswerable ones (id, question, None, plausible answer or None)
V20 = [
    ("Eiffel_Tower", EIFFEL, [
        ("v2-eif-1", "Who was the tower named after?", "Gustave Eiffel", ["the engineer Gustave Eiffel"]),
        ("v2-eif-2", "How tall is the Eiffel Tower?", "330 metres (1,083 ft)", ["330 metres"]),
        ("v2-eif-3", "In which year was the Eiffel Tower demolished?", None, "1930"),
        ("v2-eif-4", "Who designed the Chrysler Building?", None, "Gustave Eiffel"),
        ("v2-eif-5", "For what event was the tower built?", "the 1889 World's Fair", ["1889 World's Fair"]),
    ]),
    ("Marie_Curie", CURIE, [
        ("v2-cur-1", "Which elements did she discover?", "polonium and radium", []),
        ("v2-cur-2", "Which element did Curie name after France?", None, "polonium"),
        ("v2-cur-3", "In which year did Curie win the Nobel Prize in Chemistry?", "1911", []),
        ("v2-cur-4", "Who won the 1903 Nobel Prize in Chemistry?", None, "Henri Becquerel"),
    ]),
    ("Danube", DANUBE, [
        ("v2-dan-1", "In which town does the river originate?", "Donaueschingen", []),
        ("v2-dan-2", "Which capital city lies on the Volga?", None, "Vienna"),
        ("v2-dan-3", "When was the Main\u2013Danube Canal opened?", "1992", ["in 1992"]),
    ]),
]


def _span(context, text):
    start = context.find(text)
    if start < 0:
        raise SystemExit(f"{text!r} is not in the context")
    return {"text": text, "answer_start": start}


def build(articles, version, dev, v2=False):
    data = []
    for title, context, qas in articles:
        out = []
        for qid, question, answer, extra in qas:
            qa = {"id": qid, "question": question}
            if answer is None:  # unanswerable (v2.0)
                qa["answers"] = []
                qa["is_impossible"] = True
                qa["plausible_answers"] = [_span(context, extra)] if extra else []
            else:
                golds = [answer] + (list(extra) if dev else [])
                qa["answers"] = [_span(context, g) for g in golds]
                if v2:
                    qa["is_impossible"] = False
            out.append(qa)
        data.append({"title": title, "paragraphs": [{"context": context, "qas": out}]})
    return {"version": version, "data": data}


def main():
    files = {
        "train-v1.1-finetune.json": build(V11, "1.1", dev=False),
        "dev-v1.1-finetune.json": build(V11, "1.1", dev=True),
        "train-v2.0-finetune.json": build(V20, "v2.0", dev=False, v2=True),
        "dev-v2.0-finetune.json": build(V20, "v2.0", dev=True, v2=True),
    }
    for name, obj in files.items():
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(name)


if __name__ == "__main__":
    main()
