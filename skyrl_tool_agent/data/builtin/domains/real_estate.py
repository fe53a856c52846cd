"""Real estate: agents, property listings, sales and viewings."""

from __future__ import annotations

import random
from datetime import date, timedelta

from skyrl_tool_agent.data.builtin.names import (
    ADJECTIVES, CITIES, NOUNS, iso_date, maybe, person_names, skewed_choices,
)
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

AGENCIES = ("Keystone Realty", "BlueDoor Homes", "Urban Nest", "Harbor Estates", "Summit Properties")
PROPERTY_TYPES = ("House", "Apartment", "Condo", "Townhouse", "Studio")
STREET_KINDS = ("Street", "Avenue", "Road", "Lane", "Court")

TABLES = (
    Table("agents", (
        ("agent_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("agency", "TEXT"), ("phone", "TEXT"),
        ("years_active", "INTEGER"),
    )),
    Table("properties", (
        ("property_id", "INTEGER PRIMARY KEY"), ("address", "TEXT NOT NULL"), ("city", "TEXT"),
        ("property_type", "TEXT"), ("bedrooms", "INTEGER"), ("area_sqm", "INTEGER"), ("list_price", "INTEGER"),
        ("agent_id", "INTEGER"), ("listed_date", "TEXT"),
    ), (("agent_id", "agents", "agent_id"),)),
    Table("sales", (
        ("sale_id", "INTEGER PRIMARY KEY"), ("property_id", "INTEGER NOT NULL"), ("buyer_name", "TEXT"),
        ("sale_date", "TEXT"), ("sale_price", "INTEGER"),
    ), (("property_id", "properties", "property_id"),)),
    Table("viewings", (
        ("viewing_id", "INTEGER PRIMARY KEY"), ("property_id", "INTEGER NOT NULL"), ("agent_id", "INTEGER"),
        ("viewing_date", "TEXT"), ("visitor_rating", "INTEGER"),
    ), (("property_id", "properties", "property_id"), ("agent_id", "agents", "agent_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    years = rng.sample(range(1, 36), 25)  # distinct: "most experienced agent" has one answer
    agents = [(i, name, rng.choice(AGENCIES), maybe(rng, f"555-{rng.randint(1000, 9999)}", 0.2), years[i - 1])
              for i, name in enumerate(person_names(rng, 25), 1)]
    streets = rng.sample([f"{a} {n}" for a in ADJECTIVES for n in NOUNS], 150)
    agent_ids = skewed_choices(rng, range(1, 26), 150)
    properties = []
    for i in range(1, 151):
        kind = rng.choice(PROPERTY_TYPES)
        bedrooms = 0 if kind == "Studio" else rng.randint(1, 2 if kind == "Apartment" else 5)
        area = rng.randint(25, 45) if kind == "Studio" else 35 + bedrooms * rng.randint(18, 40)
        properties.append((i, f"{rng.randint(1, 250)} {streets[i - 1]} {rng.choice(STREET_KINDS)}",
                           rng.choice(CITIES[:8])[0], kind, bedrooms, area, area * rng.choice((2500, 3000, 4000, 5500)),
                           maybe(rng, agent_ids[i - 1], 0.05), iso_date(rng, "2022-01-01", "2024-04-30")))
    sold = rng.sample(range(1, 151), 70)
    sales = []
    for i, pid in enumerate(sold, 1):
        listed = date.fromisoformat(properties[pid - 1][8])
        price = properties[pid - 1][6]
        sales.append((i, pid, maybe(rng, person_names(rng, 1)[0], 0.1),
                      (listed + timedelta(days=rng.randint(10, 240))).isoformat(),
                      int(price * rng.choice((0.92, 0.95, 0.98, 1.0, 1.0, 1.03, 1.08)))))
    viewings = []
    for i, pid in enumerate(skewed_choices(rng, range(1, 151), 200), 1):
        viewings.append((i, pid, properties[pid - 1][7], iso_date(rng, "2022-02-01", "2024-06-30"),
                         maybe(rng, rng.randint(1, 5), 0.3)))
    return {"agents": agents, "properties": properties, "sales": sales, "viewings": viewings}


PROP_AGENT = "FROM properties AS T1 JOIN agents AS T2 ON T1.agent_id = T2.agent_id"
PROP_SALE = "FROM properties AS T1 JOIN sales AS T2 ON T1.property_id = T2.property_id"
PROP_VIEW = "FROM properties AS T1 JOIN viewings AS T2 ON T1.property_id = T2.property_id"
SALE_AGENT = PROP_SALE + " JOIN agents AS T3 ON T1.agent_id = T3.agent_id"
CITY = "SELECT DISTINCT city FROM properties"
PTYPE = "SELECT DISTINCT property_type FROM properties"

TEMPLATES = (
    # single table
    T("count_type_city", "SELECT COUNT(*) FROM properties WHERE property_type = '{property_type}' AND city = '{city}'",
      "How many properties of type '{property_type}' are listed in '{city}'?",
      "Count the '{property_type}' listings in '{city}'.", slots="SELECT DISTINCT property_type, city FROM properties"),
    T("addresses_bedrooms", "SELECT address FROM properties WHERE bedrooms = {bedrooms} AND city = '{city}'",
      "What are the addresses of {bedrooms}-bedroom properties in '{city}'?",
      "List the addresses in '{city}' with exactly {bedrooms} bedrooms.",
      slots="SELECT DISTINCT bedrooms, city FROM properties"),
    T("agents_agency", "SELECT name FROM agents WHERE agency = '{agency}'",
      "Which agents work for '{agency}'?",
      "List the names of agents at the agency '{agency}'.", slots="SELECT DISTINCT agency FROM agents"),
    T("avg_price_city", "SELECT AVG(list_price) FROM properties WHERE city = '{city}'",
      "What is the average list price of properties in '{city}'?",
      "Find the mean asking price in '{city}'.", slots=CITY),
    T("big_properties", "SELECT address FROM properties WHERE area_sqm > {area}",
      "Which properties are larger than {area} square meters?",
      "List the addresses of properties with an area above {area} sqm.",
      slots="SELECT area_sqm AS area FROM properties WHERE area_sqm > 180"),
    T("agents_no_phone", "SELECT name FROM agents WHERE phone IS NULL",
      "Which agents have no phone number?",
      "List the agents whose phone is missing."),
    T("price_of_address", "SELECT list_price FROM properties WHERE address = '{address}'",
      "What is the list price of '{address}'?",
      "How much is the property at '{address}' listed for?", slots="SELECT address FROM properties"),
    T("listed_after", "SELECT address FROM properties WHERE listed_date > '{date}'",
      "Which properties were listed after '{date}'?",
      "List the addresses of properties with a listed date later than '{date}'.",
      slots="SELECT listed_date AS date FROM properties WHERE listed_date > '2024-01-01'"),
    T("unrated_viewings", "SELECT COUNT(*) FROM viewings WHERE visitor_rating IS NULL",
      "How many viewings have no visitor rating?",
      "Count the viewings without a rating."),
    T("max_sale", "SELECT MAX(sale_price) FROM sales",
      "What is the highest sale price?",
      "How much did the most expensive sale go for?"),
    T("sales_in_month", "SELECT COUNT(*) FROM sales WHERE sale_date LIKE '{month}%'",
      "How many sales happened in the month '{month}'?",
      "Count the sales whose sale date falls in '{month}'.",
      slots="SELECT DISTINCT substr(sale_date, 1, 7) AS month FROM sales"),
    T("cheap_type", "SELECT address, list_price FROM properties WHERE property_type = '{property_type}' AND "
                    "list_price < {price}",
      "Which '{property_type}' listings cost less than {price}? Show address and price.",
      "List address and list price of '{property_type}' properties under {price}.",
      slots="SELECT DISTINCT property_type, list_price AS price FROM properties"),
    # one join, GROUP BY or ORDER BY
    T("listings_of_agent", f"SELECT T1.address {PROP_AGENT} WHERE T2.name = '{{agent}}'",
      "Which properties does '{agent}' represent?",
      "List the addresses listed by the agent '{agent}'.", slots=f"SELECT DISTINCT T2.name AS agent {PROP_AGENT}"),
    T("sold_in_city", f"SELECT T2.sale_price {PROP_SALE} WHERE T1.city = '{{city}}'",
      "What were the sale prices of properties sold in '{city}'?",
      "List the sale prices of sold properties located in "
      "'{city}'.", slots=f"SELECT DISTINCT T1.city AS city {PROP_SALE}"),
    T("listings_per_city", "SELECT city, COUNT(*) FROM properties GROUP BY city",
      "How many properties are listed in each city?",
      "Count the listings per city."),
    T("avg_area_per_type", "SELECT property_type, AVG(area_sqm) FROM properties GROUP BY property_type",
      "What is the average area of each property type?",
      "For every property type, show the average area in square meters."),
    T("most_expensive_in_city", "SELECT address FROM properties WHERE city = '{city}' ORDER BY list_price DESC LIMIT 1",
      "What is the most expensive listing in '{city}'?",
      "Which property in '{city}' has the highest list price?", slots=CITY),
    T("most_experienced_agent", "SELECT name FROM agents ORDER BY years_active DESC LIMIT 1",
      "Which agent has been active the longest?",
      "Who is the agent with the most years active?"),
    T("buyers_in_type", f"SELECT T2.buyer_name {PROP_SALE} WHERE T1.property_type = '{{property_type}}'",
      "Who bought properties of type '{property_type}'?",
      "List the buyer names for sold '{property_type}' properties.",
      slots=f"SELECT DISTINCT T1.property_type AS property_type {PROP_SALE}"),
    T("viewings_per_property_type", f"SELECT T1.property_type, COUNT(*) {PROP_VIEW} GROUP BY T1.property_type",
      "How many viewings has each property type had?",
      "Count the viewings per property type."),
    T("sale_of_address", f"SELECT T2.sale_date, T2.sale_price {PROP_SALE} WHERE T1.address = '{{address}}'",
      "When was '{address}' sold and for how much?",
      "Give the sale date and sale price of the property at '{address}'.",
      slots=f"SELECT DISTINCT T1.address AS address {PROP_SALE}"),
    # nesting, set operations, HAVING, several joins
    T("unsold_in_city", "SELECT address FROM properties WHERE city = '{city}' AND property_id NOT IN (SELECT "
                        "property_id FROM sales)",
      "Which properties in '{city}' have not been sold?",
      "List the unsold listings located in '{city}'.", slots=CITY),
    T("sales_by_agent", f"SELECT T1.address, T2.sale_price {SALE_AGENT} WHERE T3.name = '{{agent}}'",
      "Which properties listed by '{agent}' were sold, and at what price?",
      "List address and sale price of the sales handled by the agent '{agent}'.",
      slots=f"SELECT DISTINCT T3.name AS agent {SALE_AGENT}"),
    T("top_agent_listings", f"SELECT T2.name {PROP_AGENT} GROUP BY T1.agent_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which agent has the most listings?",
      "Who is the agent with the largest number of properties?"),
    T("above_avg_price_type",
      "SELECT address FROM properties WHERE property_type = '{property_type}' AND list_price > "
      "(SELECT AVG(list_price) FROM properties WHERE property_type = '{property_type}')",
      "Which '{property_type}' listings are priced above the average '{property_type}' listing?",
      "List the '{property_type}' properties whose list price exceeds the '{property_type}' average.", slots=PTYPE),
    T("cities_having", "SELECT city FROM properties GROUP BY city HAVING AVG(list_price) > {price}",
      "Which cities have an average list price above {price}?",
      "List the cities where properties are listed for more than {price} on average.",
      slots="SELECT DISTINCT CAST(AVG(list_price) AS INTEGER) - 1 AS price FROM properties GROUP BY city"),
    T("types_in_both_cities",
      "SELECT property_type FROM properties WHERE city = '{city1}' INTERSECT "
      "SELECT property_type FROM properties WHERE city = '{city2}'",
      "Which property types are listed in both '{city1}' and '{city2}'?",
      "Find the property types available in '{city1}' and also in '{city2}'.",
      slots="SELECT A.city AS city1, B.city AS city2 FROM (SELECT DISTINCT city FROM properties) AS A "
            "JOIN (SELECT DISTINCT city FROM properties) AS B ON A.city < B.city"),
    T("agents_without_sales_city",
      f"SELECT name FROM agents EXCEPT SELECT T3.name {SALE_AGENT} WHERE T1.city = '{{city}}'",
      "Which agents have not sold any property in '{city}'?",
      "List the agents with no sale in '{city}'.", slots=CITY),
    T("well_rated_views",
      f"SELECT DISTINCT T1.address {PROP_VIEW} WHERE T2.visitor_rating = 5 AND T1.city = '{{city}}'",
      "Which properties in '{city}' received a visitor rating of 5 at a viewing?",
      "List the distinct addresses in '{city}' with a 5-star viewing.", slots=CITY),
)

DOMAIN = Domain("real_estate", TABLES, populate, TEMPLATES)
