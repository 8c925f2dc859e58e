"""The demo model's corpus: chat-completions requests with the assistant turn
that answers them, generated from fact tables and a seed.

Each example is {"request": OpenAI chat request, "date": "YYYY-MM-DD" or
absent, "completion": Harmony text of the assistant turn after the prompt's
`<|start|>assistant`}; `flotilla render --jsonl` turns it into token ids with
the project's own renderer and tokenizer. Kinds of questions:

- facts: capitals, arithmetic, unit conversions, calendar questions, each a
  short `analysis` message then a `final` answer (or a JSON answer when the
  question asks for one);
- tools: `get_weather` and `add` called in the `commentary` channel with JSON
  arguments, then, with the tool's result in the request, the answer.

Every question is (fact, template); for each fact one of its templates is held
out (never trained on) with probability HOLDOUT, so evaluation asks known facts
in phrasings the model has not seen with them.
"""

import json
import random

HOLDOUT = 0.3

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Canada": "Ottawa", "Mexico": "Mexico City", "Brazil": "Brasilia", "Argentina": "Buenos Aires",
    "Egypt": "Cairo", "Kenya": "Nairobi", "Russia": "Moscow", "Poland": "Warsaw",
    "Sweden": "Stockholm", "Norway": "Oslo", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Greece": "Athens", "Turkey": "Ankara", "Ireland": "Dublin", "Austria": "Vienna",
    "Belgium": "Brussels", "Netherlands": "Amsterdam", "Switzerland": "Bern",
    "Australia": "Canberra", "Peru": "Lima", "Chile": "Santiago", "Cuba": "Havana",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "Indonesia": "Jakarta", "Iran": "Tehran",
    "Iraq": "Baghdad", "Hungary": "Budapest", "Ukraine": "Kyiv", "Morocco": "Rabat",
    "Nigeria": "Abuja", "Colombia": "Bogota", "Philippines": "Manila",
    "South Korea": "Seoul", "Czechia": "Prague", "Romania": "Bucharest",
    "New Zealand": "Wellington", "Scotland": "Edinburgh", "Iceland": "Reykjavik",
}

CAPITAL_TEMPLATES = [
    "What is the capital of {country}?",
    "What's the capital of {country}?",
    "Which city is the capital of {country}?",
    "Name the capital city of {country}.",
    "Tell me the capital of {country}.",
    "capital of {country}?",
]

ARITH_TEMPLATES = [
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b}.",
    "How much is {a} {op} {b}?",
    "{a} {op} {b} = ?",
]

# (question template, from-unit, to-unit, factor)
UNITS = [
    ("meters", "centimeters", 100), ("kilometers", "meters", 1000),
    ("hours", "minutes", 60), ("minutes", "seconds", 60), ("kilograms", "grams", 1000),
    ("feet", "inches", 12), ("days", "hours", 24), ("weeks", "days", 7),
]
UNIT_TEMPLATES = [
    "How many {to} are in {n} {frm}?",
    "Convert {n} {frm} to {to}.",
    "What is {n} {frm} in {to}?",
    "{n} {frm} is how many {to}?",
]

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NEXT_MONTH_TEMPLATES = [
    "What month comes after {m}?",
    "Which month follows {m}?",
    "What is the month after {m}?",
]
MONTH_DAYS_TEMPLATES = [
    "How many days are in {m}?",
    "How many days does {m} have?",
    "How long is {m} in days?",
]
NEXT_DAY_TEMPLATES = [
    "What day comes after {d}?",
    "Which day follows {d}?",
    "What is the day after {d}?",
]

WEATHER_CITIES = ["Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Oslo",
                  "Cairo", "Lima", "Seoul", "Dublin", "Vienna", "Prague", "Sydney", "Toronto",
                  "Boston", "Chicago", "Denver", "Miami", "Seattle", "Austin", "Nairobi", "Bangkok"]
WEATHER_TEMPLATES = [
    "What's the weather in {city}?",
    "What is the weather like in {city} right now?",
    "How is the weather in {city}?",
    "Is it warm in {city} today?",
]
ADD_TEMPLATES = [
    "Use the add tool to add {a} and {b}.",
    "Please add {a} and {b} with the tool.",
    "Add {a} and {b} using the add function.",
]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Gets the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["location"]}}}
ADD_TOOL = {"type": "function", "function": {
    "name": "add",
    "description": "Adds two integers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}
SYSTEMS = [None, "You are a helpful assistant.", "You are a concise assistant.",
           "Answer briefly.", "You are a helpful assistant. Be precise."]
JSON_SUFFIX = " Answer in JSON."


def facts():
    """Every fact question: (kind, key, templates, fill values, reasoning, answer, json answer)."""
    out = []
    for country, capital in CAPITALS.items():
        out.append(("capital", country, CAPITAL_TEMPLATES, {"country": country},
                    f"The capital of {country} is {capital}.",
                    f"The capital of {country} is {capital}.",
                    {"country": country, "capital": capital}, capital))
    for a in range(0, 13):
        for b in range(0, 13):
            out.append(arith(a, "+", b, a + b))
    for a in range(2, 10):
        for b in range(2, 10):
            out.append(arith(a, "*", b, a * b))
    for frm, to, factor in UNITS:
        for n in range(1, 11):
            r = n * factor
            out.append(("unit", f"{n} {frm}", UNIT_TEMPLATES, {"n": n, "frm": frm, "to": to},
                        f"1 {frm[:-1]} is {factor} {to}, so {n} {frm} is {n} * {factor} = {r} {to}.",
                        f"{n} {frm} is {r} {to}.", {"value": r, "unit": to}, str(r)))
    for i, m in enumerate(MONTHS):
        nxt = MONTHS[(i + 1) % 12]
        out.append(("next_month", m, NEXT_MONTH_TEMPLATES, {"m": m},
                    f"The month after {m} is {nxt}.", f"{nxt} comes after {m}.",
                    {"month": nxt}, nxt))
        days = MONTH_DAYS[i]
        extra = " (29 in a leap year)" if i == 1 else ""
        out.append(("month_days", m, MONTH_DAYS_TEMPLATES, {"m": m},
                    f"{m} has {days} days{extra}.", f"{m} has {days} days{extra}.",
                    {"days": days}, str(days)))
    for i, d in enumerate(WEEKDAYS):
        nxt = WEEKDAYS[(i + 1) % 7]
        out.append(("next_day", d, NEXT_DAY_TEMPLATES, {"d": d},
                    f"The day after {d} is {nxt}.", f"{nxt} comes after {d}.",
                    {"day": nxt}, nxt))
    return out


def arith(a, op, b, r):
    return ("arith", f"{a}{op}{b}", ARITH_TEMPLATES, {"a": a, "b": b, "op": op},
            f"{a} {op} {b} = {r}.", f"{a} {op} {b} = {r}.", {"result": r}, str(r))


def split_templates(rng, key, templates):
    """The template indices trained on and the one held out (or None); the
    first template, the canonical question, is always trained on."""
    idx = list(range(len(templates)))
    held = rng.choice(idx[1:]) if rng.random() < HOLDOUT else None
    return [i for i in idx if i != held], held


def base_request(rng, user, tools):
    messages = []
    system = rng.choice(SYSTEMS)
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    req = {"model": "demo", "messages": messages}
    effort = rng.choice([None, "low", "medium", "high"])
    if effort:
        req["reasoning_effort"] = effort
    if tools:
        req["tools"] = tools
    return req


def random_date(rng):
    if rng.random() < 0.2:
        return None
    return f"{rng.randint(2024, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def some_tools(rng):
    """The tools a fact question's request offers (often none)."""
    r = rng.random()
    if r < 0.6:
        return None
    if r < 0.75:
        return [WEATHER_TOOL]
    if r < 0.9:
        return [WEATHER_TOOL, ADD_TOOL]
    return [ADD_TOOL]


def fact_example(rng, fact, template, as_json):
    kind, key, templates, fill, reasoning, answer, json_answer, _ = fact
    user = templates[template].format(**fill)
    if as_json:
        user += JSON_SUFFIX
        final = json.dumps(json_answer, separators=(",", ":"))
    else:
        final = answer
    req = base_request(rng, user, some_tools(rng))
    completion = (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
                  f"<|start|>assistant<|channel|>final<|message|>{final}<|return|>")
    return {"request": req, "date": random_date(rng), "completion": completion}


def call_text(name, args):
    return (f"<|channel|>analysis<|message|>{call_reasoning(name, args)}<|end|>"
            f"<|start|>assistant<|channel|>commentary to=functions.{name}<|constrain|>json"
            f"<|message|>{json.dumps(args, separators=(',', ':'))}<|call|>")


def call_reasoning(name, args):
    if name == "get_weather":
        return f"The user asks about the weather in {args['location']}. Call get_weather."
    return f"Add {args['a']} and {args['b']} with the add tool."


def result_text(rng, result):
    """A tool result as clients send it back: JSON, compact (JavaScript's
    JSON.stringify) or spaced (Python's json.dumps), keys in either order."""
    items = list(result.items())
    if rng.random() < 0.5:
        items.reverse()
    separators = (",", ":") if rng.random() < 0.5 else (", ", ": ")
    return json.dumps(dict(items), separators=separators)


def weather_result(rng):
    return {"temperature": rng.randint(-5, 35), "condition": rng.choice(CONDITIONS)}


def weather_answer(city, result):
    return f"It is {result['temperature']} degrees and {result['condition']} in {city}."


def call_message(name, args, with_reasoning):
    """The assistant message of a call as clients send it back: the arguments
    exactly as the model wrote them, and the official clients also return the
    reasoning that came with it (rendered as the analysis message before the
    call), others not."""
    message = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, separators=(",", ":"))}}]}
    if with_reasoning:
        message["reasoning_content"] = call_reasoning(name, args)
    return message


def tool_examples(rng, user, name, args, result, answer, tools):
    """The call, then (the call and its result in the request) the answer."""
    req = base_request(rng, user, tools)
    date = random_date(rng)
    call = {"request": req, "date": date, "completion": call_text(name, args)}
    followed = json.loads(json.dumps(req))
    followed["messages"].append(call_message(name, args, rng.random() < 0.5))
    followed["messages"].append({"role": "tool", "tool_call_id": "call_1",
                                 "content": result_text(rng, result)})
    answer_text = (f"<|channel|>analysis<|message|>The tool returned the result.<|end|>"
                   f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>")
    return [call, {"request": followed, "date": date, "completion": answer_text}]


def weather(rng, city, template):
    result = weather_result(rng)
    tools = rng.choice([[WEATHER_TOOL], [WEATHER_TOOL, ADD_TOOL], [ADD_TOOL, WEATHER_TOOL]])
    return tool_examples(rng, WEATHER_TEMPLATES[template].format(city=city), "get_weather",
                         {"location": city}, result, weather_answer(city, result), tools)


def addition(rng, a, b, template):
    tools = rng.choice([[ADD_TOOL], [WEATHER_TOOL, ADD_TOOL]])
    return tool_examples(rng, ADD_TEMPLATES[template].format(a=a, b=b), "add", {"a": a, "b": b},
                         {"result": a + b}, f"{a} + {b} = {a + b}.", tools)


def generate(seed, copies):
    """(train examples, held-out questions). Each held-out question is
    {"kind", "question", "answer" (the word the final answer must contain),
    "json": expected JSON answer or absent, "tool": {name, arguments} for calls}."""
    rng = random.Random(seed)
    train, held = [], []
    for fact in facts():
        kind, key, templates = fact[0], fact[1], fact[2]
        trained, held_out = split_templates(rng, key, templates)
        for _ in range(copies):
            for t in trained:
                train.append(fact_example(rng, fact, t, as_json=rng.random() < 0.15))
        if held_out is not None:
            held.append({"kind": kind, "question": templates[held_out].format(**fact[3]),
                         "answer": fact[7], "json": fact[6]})
    for city in WEATHER_CITIES:
        trained, held_out = split_templates(rng, city, WEATHER_TEMPLATES)
        for _ in range(2 * copies):  # copying the city takes more examples than a fact
            for t in trained:
                train.extend(weather(rng, city, t))
        if held_out is not None:
            held.append({"kind": "weather", "question": WEATHER_TEMPLATES[held_out].format(city=city),
                         "tool": {"name": "get_weather", "arguments": {"location": city}}})
    for a in range(1, 10):
        for b in range(1, 10):
            trained, held_out = split_templates(rng, f"{a}+{b}", ADD_TEMPLATES)
            for t in trained:
                if rng.random() < 0.5 * copies:
                    train.extend(addition(rng, a, b, t))
            if held_out is not None:
                held.append({"kind": "add", "question": ADD_TEMPLATES[held_out].format(a=a, b=b),
                             "tool": {"name": "add", "arguments": {"a": a, "b": b}}})
    rng.shuffle(train)
    return train, held


def tool_result_checks(seed):
    """Answers after a tool's result, for evaluation: per weather city and
    for some additions, the call a question gets and a fresh result, compact
    and spaced. {"question", "tool": {name, arguments}, "result": the tool
    message's content, "answer": the words the final answer must hold}."""
    rng = random.Random(seed + 1)
    out = []
    for city in WEATHER_CITIES:
        for separators in ((",", ":"), (", ", ": ")):
            result = weather_result(rng)
            out.append({"question": WEATHER_TEMPLATES[0].format(city=city),
                        "tool": {"name": "get_weather", "arguments": {"location": city}},
                        "result": json.dumps(result, separators=separators),
                        "answer": [f"is {result['temperature']} degrees", result["condition"], city]})
    for _ in range(12):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        separators = rng.choice(((",", ":"), (", ", ": ")))
        out.append({"question": ADD_TEMPLATES[0].format(a=a, b=b),
                    "tool": {"name": "add", "arguments": {"a": a, "b": b}},
                    "result": json.dumps({"result": a + b}, separators=separators),
                    "answer": [f"{a} + {b} = {a + b}"]})
    # Every other one sent back with the call's reasoning, as the official
    # clients do.
    for i, c in enumerate(out):
        if i % 2 == 1:
            c["reasoning"] = call_reasoning(c["tool"]["name"], c["tool"]["arguments"])
    return out
