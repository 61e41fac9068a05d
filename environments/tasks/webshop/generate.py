"""The built-in shop, generated: products and shopping instructions in WebShop's formats.

:func:`generate_shop` returns a catalogue in WebShop's ``items_shuffle.json`` format
(plus ``attributes``, ``reviews`` and ``rating``) and instructions in its
``items_human_ins.json`` format (with a ``price_upper`` each), so the built-in shop
loads through the same reader as WebShop's real files (`tasks.webshop.catalogue`).

Deterministic: one seeded ``random.Random`` per product type, so a product depends only
on (seed, type, number) and a larger shop holds the smaller one's products. Twelve
product types; per type ``products_per_type`` products with distinct titles (brand,
product line, two attributes, a noun) and ``goals_per_type`` instructions on distinct
products. Every instruction names two of its product's attributes and one value of
each of its option groups, so a buyer who finds the product, picks those options and
buys it under the price limit scores 1.0 with WebShop's reward; a same-type product
with other attributes or options scores less (`tasks.webshop.reward`).

The default (500 products and 250 instructions per type: 6,000 products, 3,000
instructions) is generated in about a second and cached per process.
"""

from __future__ import annotations

import functools
import random

__all__ = ["BRANDS", "LINES", "TYPES", "generate_shop"]

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
    {
        "category": "kitchen",
        "query": "frying pan",
        "product_category": ["Home & Kitchen", "Kitchen & Dining", "Cookware", "Skillets"],
        "nouns": ["Frying Pan", "Skillet", "Saute Pan", "Wok"],
        "who": "",
        "attributes": [
            "non stick", "dishwasher safe", "induction compatible", "oven safe",
            "pfoa free", "stainless steel", "cast iron", "stay cool handle",
        ],
        "options": {
            "size": ["8 inch", "10 inch", "12 inch", "14 inch"],
            "color": ["black", "grey", "red", "copper"],
        },
        "price": (15, 120),
    },
    {
        "category": "sports",
        "query": "yoga mat",
        "product_category": ["Sports & Outdoors", "Exercise & Fitness", "Yoga", "Mats"],
        "nouns": ["Yoga Mat", "Exercise Mat", "Pilates Mat", "Fitness Mat"],
        "who": "",
        "attributes": [
            "extra thick", "non slip", "eco friendly", "carrying strap", "high density",
            "sweat resistant", "latex free", "easy to clean",
        ],
        "options": {
            "color": ["purple", "blue", "black", "green", "pink", "grey"],
            "size": ["4mm", "6mm", "10mm"],
        },
        "price": (12, 85),
    },
    {
        "category": "pets",
        "query": "dog leash",
        "product_category": ["Pet Supplies", "Dogs", "Collars, Harnesses & Leashes", "Leashes"],
        "nouns": ["Dog Leash", "Retractable Leash", "Training Lead", "Rope Leash"],
        "who": "",
        "attributes": [
            "reflective stitching", "padded handle", "heavy duty", "tangle free",
            "quick release", "waterproof", "chew resistant", "lightweight",
        ],
        "options": {
            "color": ["black", "red", "blue", "orange", "green"],
            "size": ["small", "medium", "large"],
        },
        "price": (8, 40),
    },
    {
        "category": "home",
        "query": "bath towels",
        "product_category": ["Home & Kitchen", "Bath", "Towels", "Bath Towels"],
        "nouns": ["Bath Towel Set", "Bath Sheet", "Hand Towels", "Towel Bundle"],
        "who": "",
        "attributes": [
            "100% cotton", "quick dry", "highly absorbent", "ultra soft", "hotel quality",
            "machine washable", "lint free", "oeko-tex certified",
        ],
        "options": {
            "color": ["white", "grey", "navy", "sage", "beige", "charcoal"],
            "size": ["set of 2", "set of 4", "set of 6"],
        },
        "price": (14, 75),
    },
    {
        "category": "toys",
        "query": "building blocks",
        "product_category": ["Toys & Games", "Building Toys", "Building Sets", "Blocks"],
        "nouns": ["Building Blocks", "Brick Set", "Construction Kit", "Magnetic Tiles"],
        "who": "Kids",
        "attributes": [
            "bpa free", "educational", "compatible with major brands", "storage box",
            "stem learning", "easy to clean", "non toxic", "creative play",
        ],
        "options": {
            "size": ["100 pieces", "250 pieces", "500 pieces", "1000 pieces"],
            "style": ["classic", "city", "space", "castle"],
        },
        "price": (10, 90),
    },
    {
        "category": "garden",
        "query": "garden hose",
        "product_category": ["Patio, Lawn & Garden", "Watering Equipment", "Hoses", "Hoses"],
        "nouns": ["Garden Hose", "Expandable Hose", "Water Hose", "Soaker Hose"],
        "who": "",
        "attributes": [
            "kink free", "leak proof", "brass fittings", "uv resistant", "lightweight",
            "flexible", "drinking water safe", "all weather",
        ],
        "options": {
            "size": ["25 ft", "50 ft", "75 ft", "100 ft"],
            "color": ["green", "blue", "black", "grey"],
        },
        "price": (16, 110),
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


LINES = [
    "Classic", "Pro", "Lite", "Max", "Flex", "Air", "Core", "Plus", "Prime", "Edge", "Nova",
    "Terra", "Urban", "Zen", "Peak", "Pulse",
]  # fmt: skip
"""Product lines: with the brand, two attributes and the noun they make titles distinct."""


def _product(rng: random.Random, kind: dict, number: int, asin: str, taken: set[str]) -> dict:
    noun = kind["nouns"][number % len(kind["nouns"])]
    brand = BRANDS[number % len(BRANDS)]
    while True:  # a title no earlier product of the type has (~57k per brand and noun)
        attributes = rng.sample(kind["attributes"], 4)
        line = rng.choice(LINES)
        shown = " ".join(a.title() for a in attributes[:2])
        title = " ".join(w for w in (brand, line, kind["who"], shown, noun) if w)
        if title not in taken:
            taken.add(title)
            break
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
        f"The {brand} {line} {noun.lower()} is {attributes[0]} and {attributes[1]}. "
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


@functools.lru_cache(maxsize=4)
def generate_shop(
    products_per_type: int = 500, goals_per_type: int = 250, seed: int = 20220704
) -> tuple[tuple[dict, ...], dict[str, list[dict]]]:
    """The catalogue (shuffled, WebShop format) and the instructions (asin -> entries) of a
    shop of ``products_per_type`` products and ``goals_per_type`` instructions per type.

    Cached: callers must not change what it returns (the catalogue reader only reads).
    """
    if products_per_type < 1 or not 1 <= goals_per_type <= products_per_type:
        raise ValueError(
            "webshop: need products_per_type >= 1 and 1 <= goals_per_type <= products_per_type"
        )
    products: list[dict] = []
    instructions: dict[str, list[dict]] = {}
    texts: set[str] = set()
    for t, kind in enumerate(TYPES):
        rng = random.Random(f"{seed}:{kind['query']}")
        taken: set[str] = set()
        made = [
            _product(rng, kind, n, f"WS{t:02d}{n:06d}", taken) for n in range(products_per_type)
        ]
        products += made
        goal_rng = random.Random(f"{seed}:{kind['query']}:goals")
        order = goal_rng.sample(range(products_per_type), products_per_type)
        chosen: dict[int, dict] = {}
        for n in order:  # products in a seeded order; an instruction text is never repeated
            noun = kind["nouns"][n % len(kind["nouns"])]
            entry = _instruction(goal_rng, kind, made[n], noun)
            if entry["instruction"] not in texts:
                texts.add(entry["instruction"])
                chosen[n] = entry
                if len(chosen) == goals_per_type:
                    break
        for n in sorted(chosen):
            instructions[made[n]["asin"]] = [chosen[n]]
    random.Random(seed).shuffle(products)
    return tuple(products), instructions
