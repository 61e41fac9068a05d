"""Writes the built-in WebShop data: webshop_items.json and webshop_instructions.json.

    python environments/tasks/webshop/data/webshop_generate.py

Deterministic (seeded): six product types of 25 products each, in WebShop's
``items_shuffle.json`` format (plus ``attributes``, ``reviews`` and ``rating``),
and 30 instructions (five per type) in ``items_human_ins.json`` format with a
``price_upper`` each. Every instruction names two of its product's attributes and
one value of each of its option groups, so a buyer who finds the product, picks
those options and buys it scores 1.0.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
PER_TYPE = 25
GOALS_PER_TYPE = 5

TYPES = [
    {
        "category": "fashion",
        "query": "men's sneakers",
        "product_category": ["Clothing, Shoes & Jewelry", "Men", "Shoes", "Fashion Sneakers"],
        "nouns": ["Running Sneakers", "Walking Shoes", "Fashion Sneakers", "Trail Shoes"],
        "who": "Men's",
        "attributes": [
            "rubber sole", "lace up", "breathable", "lightweight", "non slip",
            "memory foam", "arch support", "machine washable",
        ],
        "options": {
            "color": ["black", "white", "navy", "grey", "red", "olive"],
            "size": ["7", "8", "8.5", "9", "9.5", "10", "11", "12"],
        },
        "price": (24, 95),
    },
    {
        "category": "fashion",
        "query": "women's t-shirt",
        "product_category": ["Clothing, Shoes & Jewelry", "Women", "Clothing", "Tops & Tees"],
        "nouns": ["Cotton T-Shirt", "Graphic Tee", "Casual Tunic Top", "Basic Tee Shirt"],
        "who": "Women's",
        "attributes": [
            "short sleeve", "long sleeve", "machine wash", "relaxed fit", "v neck",
            "crew neck", "moisture wicking", "soft fabric",
        ],
        "options": {
            "color": ["black", "white", "pink", "teal", "burgundy", "yellow"],
            "size": ["small", "medium", "large", "x-large", "xx-large"],
        },
        "price": (9, 35),
    },
    {
        "category": "electronics",
        "query": "wireless headphones",
        "product_category": ["Electronics", "Headphones, Earbuds & Accessories", "Headphones"],
        "nouns": ["Wireless Headphones", "Bluetooth Headset", "Over Ear Headphones", "Earbuds"],
        "who": "",
        "attributes": [
            "noise cancelling", "long battery life", "fast charging", "hands free",
            "built-in microphone", "water resistant", "foldable design", "high fidelity",
        ],
        "options": {"color": ["black", "white", "silver", "blue", "rose gold"]},
        "price": (19, 180),
    },
    {
        "category": "grocery",
        "query": "ground coffee",
        "product_category": ["Grocery & Gourmet Food", "Beverages", "Coffee", "Ground Coffee"],
        "nouns": ["Ground Coffee", "Coffee Beans", "Espresso Roast Coffee", "Cold Brew Coffee"],
        "who": "",
        "attributes": [
            "gluten free", "non gmo", "usda organic", "fair trade", "dark roast",
            "medium roast", "low acid", "small batch",
        ],
        "options": {
            "flavor name": ["original", "vanilla", "hazelnut", "caramel", "mocha"],
            "size": ["12 ounce", "2 pound", "pack of 2", "pack of 4"],
        },
        "price": (7, 48),
    },
    {
        "category": "beauty",
        "query": "shampoo",
        "product_category": [
            "Beauty & Personal Care", "Hair Care", "Shampoo & Conditioner", "Shampoos",
        ],
        "nouns": ["Shampoo", "Shampoo and Conditioner Set", "Clarifying Shampoo", "Hair Wash"],
        "who": "",
        "attributes": [
            "sulfate free", "paraben free", "cruelty free", "tea tree", "hair growth",
            "dry hair", "color treated", "travel size",
        ],
        "options": {
            "scent": ["lavender", "coconut", "unscented", "citrus", "argan oil"],
            "size": ["8 fl oz", "16 fl oz", "33.8 fl oz"],
        },
        "price": (6, 42),
    },
    {
        "category": "furniture",
        "query": "office chair",
        "product_category": ["Home & Kitchen", "Furniture", "Home Office Furniture", "Chairs"],
        "nouns": ["Office Chair", "Desk Chair", "Gaming Chair", "Task Chair"],
        "who": "",
        "attributes": [
            "lumbar support", "height adjustable", "mesh back", "easy assembly",
            "heavy duty", "padded armrests", "ergonomic design", "smooth wheels",
        ],
        "options": {
            "color": ["black", "grey", "white", "blue", "pink"],
            "style": ["with footrest", "without footrest"],
        },
        "price": (45, 260),
    },
]  # fmt: skip

BRANDS = [
    "Aldane", "Brivo", "Corvex", "Dunmore", "Elstar", "Fenwick", "Galtra", "Hollis", "Irven",
    "Jasko", "Kestrel", "Lumio", "Marlow", "Norvik", "Ostra", "Pellan", "Quorra", "Rivet",
    "Sorrel", "Tavish", "Umbra", "Vantor", "Wexley", "Yarrow", "Zephra",
]  # fmt: skip
REVIEWS = [
    (5, "Exactly as described, would buy again."),
    (4, "Good value for the price."),
    (3, "It is fine, nothing special."),
    (2, "Not what I expected."),
]


def _product(rng: random.Random, kind: dict, number: int, asin: str) -> dict:
    attributes = rng.sample(kind["attributes"], 4)
    noun = kind["nouns"][number % len(kind["nouns"])]
    brand = BRANDS[number % len(BRANDS)]
    shown = " ".join(a.title() for a in attributes[:2])
    title = " ".join(w for w in (brand, kind["who"], shown, noun) if w)
    options = {}
    for name, values in kind["options"].items():
        count = rng.randint(2, min(5, len(values)))
        options[name] = [{"value": v, "image": None} for v in rng.sample(values, count)]
    low, high = kind["price"]
    price = round(rng.uniform(low, high), 2)
    pricing = f"${price:.2f}"
    if number % 6 == 5:
        pricing = f"${price:.2f} - ${price + rng.randint(3, 15):.2f}"
    bullets = [f"{a.upper()}: made to be {a} for everyday use." for a in attributes]
    description = (
        f"The {brand} {noun.lower()} is {attributes[0]} and {attributes[1]}. "
        f"Designed with care, it is also {attributes[2]}."
    )
    return {
        "asin": asin,
        "name": title,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "customization_options": options,
        "category": kind["category"],
        "query": kind["query"],
        "product_category": " \u203a ".join(kind["product_category"]),
        "images": [f"https://example.invalid/{asin}.jpg"],
        "attributes": attributes,
        "reviews": [{"score": s, "body": b} for s, b in rng.sample(REVIEWS, 2)],
        "rating": f"{rng.uniform(3, 5):.1f}",
    }


def _instruction(rng: random.Random, kind: dict, product: dict, noun: str) -> dict:
    wanted = rng.sample(product["attributes"], 2)
    chosen = {n: rng.choice(vs)["value"] for n, vs in product["customization_options"].items()}
    text = f"i am looking for {kind['query']} ({noun.lower()}) that are {wanted[0]} and {wanted[1]}"
    text += "".join(f", and {name} {value}" for name, value in chosen.items())
    high = max(float(p.split()[0]) for p in product["pricing"].split("$")[1:])
    return {
        "asin": product["asin"],
        "instruction": text,
        "instruction_attributes": wanted,
        "instruction_options": list(chosen.values()),
        "price_upper": float((int(high) // 10 + 2) * 10),
    }


def generate() -> tuple[list[dict], dict[str, list[dict]]]:
    rng = random.Random(20220704)
    products, instructions = [], {}
    for t, kind in enumerate(TYPES):
        made = [_product(rng, kind, n, f"WS{t}{n:07d}") for n in range(PER_TYPE)]
        products += made
        for n in sorted(rng.sample(range(PER_TYPE), GOALS_PER_TYPE)):
            noun = kind["nouns"][n % len(kind["nouns"])]
            instructions[made[n]["asin"]] = [_instruction(rng, kind, made[n], noun)]
    random.Random(233).shuffle(products)
    return products, instructions


def main() -> None:
    products, instructions = generate()
    (HERE / "webshop_items.json").write_text(json.dumps(products, indent=1) + "\n")
    (HERE / "webshop_instructions.json").write_text(json.dumps(instructions, indent=1) + "\n")


if __name__ == "__main__":
    main()
