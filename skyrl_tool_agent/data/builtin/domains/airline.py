"""Airline: airports, aircraft, flights, passengers and bookings."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import CITIES, iso_date, maybe, person_names, skewed_choices
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

AIRPORT_CODES = ("BOS", "ORD", "DEN", "SEA", "YYZ", "YVR", "LYS", "CDG", "BER", "MUC",
                 "MAD", "SVQ", "FCO", "MXP", "HND", "KIX", "SYD", "PER", "LOS", "BOM")
MODELS = (("A320", "Airbus", 180), ("A321", "Airbus", 220), ("A350", "Airbus", 325), ("B737", "Boeing", 189),
          ("B787", "Boeing", 296), ("B777", "Boeing", 396), ("E190", "Embraer", 100), ("CRJ900", "Bombardier", 90))
SEAT_CLASSES = ("Economy", "Economy", "Economy", "Premium Economy", "Business", "First")
LEVELS = ("Silver", "Gold", "Platinum")
NATIONALITIES = ("USA", "Canada", "France", "Germany", "Spain", "Italy", "Japan", "Australia", "Nigeria", "India")

TABLES = (
    Table("airports", (
        ("airport_id", "INTEGER PRIMARY KEY"), ("code", "TEXT NOT NULL"), ("city", "TEXT"), ("country", "TEXT"),
    )),
    Table("aircraft", (
        ("aircraft_id", "INTEGER PRIMARY KEY"), ("registration", "TEXT NOT NULL"), ("model", "TEXT"),
        ("manufacturer", "TEXT"), ("seats", "INTEGER"), ("year_built", "INTEGER"),
    )),
    Table("flights", (
        ("flight_id", "INTEGER PRIMARY KEY"), ("flight_number", "TEXT NOT NULL"),
        ("origin_airport_id", "INTEGER NOT NULL"), ("destination_airport_id", "INTEGER NOT NULL"),
        ("aircraft_id", "INTEGER"), ("departure_date", "TEXT"), ("duration_minutes", "INTEGER"), ("price", "REAL"),
    ), (("origin_airport_id", "airports", "airport_id"), ("destination_airport_id", "airports", "airport_id"),
        ("aircraft_id", "aircraft", "aircraft_id"))),
    Table("passengers", (
        ("passenger_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("nationality", "TEXT"),
        ("frequent_flyer_level", "TEXT"),
    )),
    Table("bookings", (
        ("booking_id", "INTEGER PRIMARY KEY"), ("flight_id", "INTEGER NOT NULL"), ("passenger_id", "INTEGER NOT NULL"),
        ("seat_class", "TEXT"), ("booking_date", "TEXT"),
    ), (("flight_id", "flights", "flight_id"), ("passenger_id", "passengers", "passenger_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    airports = [(i, code, city, country) for i, (code, (city, country)) in enumerate(zip(AIRPORT_CODES, CITIES), 1)]
    aircraft = []
    for i in range(1, 25):
        model, maker, seats = rng.choice(MODELS)
        aircraft.append((i, f"N{rng.randint(100, 999)}{rng.choice('ABCDEFGHJK')}{rng.choice('LMNPRSTUVX')}",
                         model, maker, seats, rng.randint(1998, 2022)))
    origins = skewed_choices(rng, range(1, 21), 150)
    numbers = rng.sample(range(100, 1000), 150)
    durations = rng.sample(range(55, 900, 5), 150)  # distinct, so "longest flight" has one answer
    flights = []
    for i in range(1, 151):
        dest = rng.choice([a for a in range(1, 21) if a != origins[i - 1]])
        duration = durations[i - 1]
        flights.append((i, f"SK{numbers[i - 1]}", origins[i - 1], dest, maybe(rng, rng.randint(1, 24), 0.05),
                        iso_date(rng, "2024-03-01", "2024-08-31"), duration,
                        round(60 + duration * rng.choice((0.4, 0.5, 0.6, 0.8)), 0)))
    passengers = [(i, name, rng.choice(NATIONALITIES), maybe(rng, rng.choice(LEVELS), 0.55))
                  for i, name in enumerate(person_names(rng, 100), 1)]
    flight_ids = skewed_choices(rng, range(1, 151), 200)
    passenger_ids = skewed_choices(rng, range(1, 101), 200)
    bookings = [(i, flight_ids[i - 1], passenger_ids[i - 1], rng.choice(SEAT_CLASSES),
                 iso_date(rng, "2024-01-01", "2024-02-28")) for i in range(1, 201)]
    return {"airports": airports, "aircraft": aircraft, "flights": flights, "passengers": passengers,
            "bookings": bookings}


ORIGIN = "FROM flights AS T1 JOIN airports AS T2 ON T1.origin_airport_id = T2.airport_id"
DEST = "FROM flights AS T1 JOIN airports AS T2 ON T1.destination_airport_id = T2.airport_id"
ROUTE = ORIGIN + " JOIN airports AS T3 ON T1.destination_airport_id = T3.airport_id"
PASS_BOOK = "FROM passengers AS T1 JOIN bookings AS T2 ON T1.passenger_id = T2.passenger_id"
PASS_FLIGHT = PASS_BOOK + " JOIN flights AS T3 ON T2.flight_id = T3.flight_id"
FLIGHT_AIRCRAFT = "FROM flights AS T1 JOIN aircraft AS T2 ON T1.aircraft_id = T2.aircraft_id"

TEMPLATES = (
    # single table
    T("aircraft_by_maker", "SELECT registration FROM aircraft WHERE manufacturer = '{maker}'",
      "List the registrations of aircraft made by '{maker}'.",
      "Which aircraft were built by '{maker}'? Give their registrations.",
      slots="SELECT DISTINCT manufacturer AS maker FROM aircraft"),
    T("seats_of_model", "SELECT seats FROM aircraft WHERE registration = '{reg}'",
      "How many seats does the aircraft '{reg}' have?",
      "What is the seat count of aircraft '{reg}'?", slots="SELECT registration AS reg FROM aircraft"),
    T("passengers_level", "SELECT name FROM passengers WHERE frequent_flyer_level = '{level}'",
      "Which passengers have the '{level}' frequent flyer level?",
      "List the '{level}' frequent flyers.", slots="SELECT DISTINCT frequent_flyer_level AS level FROM passengers"),
    T("no_level_count", "SELECT COUNT(*) FROM passengers WHERE frequent_flyer_level IS NULL",
      "How many passengers have no frequent flyer level?",
      "Count the passengers without a frequent flyer level."),
    T("count_nationality", "SELECT COUNT(*) FROM passengers WHERE nationality = '{nat}'",
      "How many passengers have the nationality '{nat}'?",
      "Count the passengers from '{nat}'.", slots="SELECT DISTINCT nationality AS nat FROM passengers"),
    T("flights_on_date", "SELECT flight_number FROM flights WHERE departure_date = '{date}'",
      "Which flights depart on '{date}'?",
      "List the flight numbers departing on '{date}'.", slots="SELECT departure_date AS date FROM flights"),
    T("long_flights", "SELECT flight_number FROM flights WHERE duration_minutes > {minutes}",
      "Which flights last longer than {minutes} minutes?",
      "List the flight numbers with a duration above {minutes} minutes.",
      slots="SELECT duration_minutes AS minutes FROM flights WHERE duration_minutes > 600"),
    T("price_of_flight", "SELECT price FROM flights WHERE flight_number = '{number}'",
      "What is the price of flight '{number}'?",
      "How much does a ticket on flight '{number}' cost?", slots="SELECT flight_number AS number FROM flights"),
    T("avg_duration", "SELECT AVG(duration_minutes) FROM flights",
      "What is the average flight duration in minutes?",
      "How long is a flight on average, in minutes?"),
    T("count_class", "SELECT COUNT(*) FROM bookings WHERE seat_class = '{seat_class}'",
      "How many bookings are in '{seat_class}'?",
      "Count the bookings with seat class '{seat_class}'.", slots="SELECT DISTINCT seat_class FROM bookings"),
    T("airports_country", "SELECT code FROM airports WHERE country = '{country}'",
      "What are the codes of the airports in '{country}'?",
      "List the airport codes for the country '{country}'.", slots="SELECT DISTINCT country FROM airports"),
    T("old_aircraft", "SELECT registration FROM aircraft WHERE year_built < {year} AND manufacturer = '{maker}'",
      "Which '{maker}' aircraft were built before {year}?",
      "List the registrations of '{maker}' aircraft with a build year earlier than {year}.",
      slots="SELECT DISTINCT manufacturer AS maker, year_built AS year FROM aircraft"),
    # one join, GROUP BY or ORDER BY
    T("flights_from_city", f"SELECT T1.flight_number {ORIGIN} WHERE T2.city = '{{city}}'",
      "Which flights depart from '{city}'?",
      "List the numbers of flights leaving '{city}'.", slots=f"SELECT DISTINCT T2.city AS city {ORIGIN}"),
    T("avg_price_to_city", f"SELECT AVG(T1.price) {DEST} WHERE T2.city = '{{city}}'",
      "What is the average price of flights to '{city}'?",
      "Find the mean ticket price of flights arriving in '{city}'.", slots=f"SELECT DISTINCT T2.city AS city {DEST}"),
    T("bookings_per_class", "SELECT seat_class, COUNT(*) FROM bookings GROUP BY seat_class",
      "How many bookings are there for each seat class?",
      "Count the bookings per seat class."),
    T("longest_flight", "SELECT flight_number FROM flights ORDER BY duration_minutes DESC LIMIT 1",
      "Which flight has the longest duration?",
      "What is the number of the longest flight?"),
    T("cheapest_from_code", f"SELECT T1.flight_number {ORIGIN} WHERE T2.code = '{{code}}' ORDER BY T1.price LIMIT 1",
      "What is the cheapest flight departing from airport '{code}'?",
      "Which flight leaving '{code}' has the lowest price?", slots=f"SELECT DISTINCT T2.code AS code {ORIGIN}"),
    T("aircraft_per_maker", "SELECT manufacturer, COUNT(*) FROM aircraft GROUP BY manufacturer",
      "How many aircraft does the airline have from each manufacturer?",
      "Count the aircraft per manufacturer."),
    T("flights_of_passenger", f"SELECT T2.flight_id {PASS_BOOK} WHERE T1.name = '{{name}}'",
      "Which flight ids has '{name}' booked?",
      "List the flight ids booked by the passenger '{name}'.", slots=f"SELECT DISTINCT T1.name AS name {PASS_BOOK}"),
    T("flights_by_model", f"SELECT T1.flight_number {FLIGHT_AIRCRAFT} WHERE T2.model = '{{model}}'",
      "Which flights are operated with the aircraft model '{model}'?",
      "List the flight numbers flown by '{model}' "
      "aircraft.", slots=f"SELECT DISTINCT T2.model AS model {FLIGHT_AIRCRAFT}"),
    T("departures_per_city", f"SELECT T2.city, COUNT(*) {ORIGIN} GROUP BY T2.city",
      "How many flights depart from each city?",
      "For every origin city, count the departing flights."),
    # nesting, set operations, HAVING, several joins
    T("route_flights", f"SELECT T1.flight_number {ROUTE} WHERE T2.city = '{{origin}}' AND T3.city = '{{dest}}'",
      "Which flights go from '{origin}' to '{dest}'?",
      "List the flight numbers from '{origin}' to '{dest}'.",
      slots=f"SELECT DISTINCT T2.city AS origin, T3.city AS dest {ROUTE}"),
    T("passengers_to_city",
      f"SELECT DISTINCT T1.name {PASS_FLIGHT} JOIN airports AS T4 ON T3.destination_airport_id = T4.airport_id "
      "WHERE T4.city = '{city}'",
      "Which passengers have booked a flight to '{city}'?",
      "List the distinct passengers flying to '{city}'.",
      slots=f"SELECT DISTINCT T2.city AS city {DEST} JOIN bookings AS T3 ON T1.flight_id = T3.flight_id"),
    T("never_booked", "SELECT name FROM passengers WHERE nationality = '{nat}' AND passenger_id NOT IN (SELECT "
                      "passenger_id FROM bookings)",
      "Which passengers from '{nat}' have never made a booking?",
      "List the '{nat}' passengers with no bookings.", slots="SELECT DISTINCT nationality AS nat FROM passengers"),
    T("busiest_origin", f"SELECT T2.city {ORIGIN} GROUP BY T1.origin_airport_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which city has the most departing flights?",
      "What is the busiest origin city by number of flights?"),
    T("above_avg_price", "SELECT flight_number FROM flights WHERE departure_date = '{date}' AND price > (SELECT "
                         "AVG(price) FROM flights)",
      "Which flights on '{date}' cost more than the average flight?",
      "List the flights departing '{date}' whose price is above the average price.",
      slots="SELECT departure_date AS date FROM flights"),
    T("two_classes",
      f"SELECT T1.name {PASS_BOOK} WHERE T2.seat_class = '{{class1}}' INTERSECT "
      f"SELECT T1.name {PASS_BOOK} WHERE T2.seat_class = '{{class2}}'",
      "Which passengers have booked both '{class1}' and '{class2}' seats?",
      "Find the passengers with bookings in seat class '{class1}' and also in seat class '{class2}'.",
      slots="SELECT A.seat_class AS class1, B.seat_class AS class2 FROM (SELECT DISTINCT seat_class FROM bookings) "
            "AS A "
            "JOIN (SELECT DISTINCT seat_class FROM bookings) AS B ON A.seat_class < B.seat_class"),
    T("cities_having_departures", f"SELECT T2.city {ORIGIN} GROUP BY T1.origin_airport_id HAVING COUNT(*) > {{n}}",
      "Which cities have more than {n} departing flights?",
      "List the origin cities with over {n} flights.",
      slots="SELECT DISTINCT COUNT(*) - 1 AS n FROM flights GROUP BY origin_airport_id"),
    T("no_departures", "SELECT code FROM airports EXCEPT SELECT T2.code FROM flights AS T1 JOIN airports AS T2 "
      "ON T1.origin_airport_id = T2.airport_id WHERE T1.departure_date LIKE '{month}%'",
      "Which airports have no departures in the month '{month}'?",
      "List the airport codes without any flight leaving during '{month}'.",
      slots="SELECT DISTINCT substr(departure_date, 1, 7) AS month FROM flights"),
    T("popular_flights",
      "SELECT T1.flight_number FROM flights AS T1 JOIN bookings AS T2 ON T1.flight_id = T2.flight_id "
      "GROUP BY T1.flight_id HAVING COUNT(*) >= {n}",
      "Which flights have at least {n} bookings?",
      "List the flight numbers with {n} or more bookings.",
      slots="SELECT DISTINCT COUNT(*) AS n FROM bookings GROUP BY flight_id HAVING COUNT(*) >= 3"),
)

DOMAIN = Domain("airline", TABLES, populate, TEMPLATES)
