"""Retail store: customers, products, orders and order items."""

from __future__ import annotations

import random

from skyrl_tool_agent.data.builtin.names import CITIES, email_for, iso_date, maybe, person_names, skewed_choices
from skyrl_tool_agent.data.builtin.schema import Domain, Row, T, Table

# category -> product nouns
CATALOG = {
    "Kitchen": ("Mug", "Kettle", "Toaster", "Knife Set", "Blender", "Teapot"),
    "Electronics": ("Headphones", "Charger", "Speaker", "Webcam", "Keyboard", "Mouse"),
    "Garden": ("Hose", "Shovel", "Planter", "Rake", "Lantern", "Bird Feeder"),
    "Toys": ("Puzzle", "Kite", "Robot", "Yo-Yo", "Board Game", "Teddy Bear"),
    "Clothing": ("Scarf", "Hoodie", "Raincoat", "Beanie", "Sneakers", "Gloves"),
}
STYLES = ("Classic", "Deluxe", "Eco", "Mini", "Pro", "Retro", "Smart", "Ultra")
STATUSES = ("Delivered", "Delivered", "Shipped", "Pending", "Returned")
TIERS = ("Bronze", "Silver", "Gold")
BASE_PRICES = (4.99, 9.99, 14.5, 19.99, 24.99, 39.0, 49.99, 79.95)

TABLES = (
    Table("customers", (
        ("customer_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("city", "TEXT"),
        ("email", "TEXT"), ("signup_date", "TEXT"), ("loyalty_tier", "TEXT"),
    )),
    Table("products", (
        ("product_id", "INTEGER PRIMARY KEY"), ("name", "TEXT NOT NULL"), ("category", "TEXT"),
        ("price", "REAL"), ("stock", "INTEGER"),
    )),
    Table("orders", (
        ("order_id", "INTEGER PRIMARY KEY"), ("customer_id", "INTEGER NOT NULL"), ("order_date", "TEXT NOT NULL"),
        ("status", "TEXT"),
    ), (("customer_id", "customers", "customer_id"),)),
    Table("order_items", (
        ("item_id", "INTEGER PRIMARY KEY"), ("order_id", "INTEGER NOT NULL"), ("product_id", "INTEGER NOT NULL"),
        ("quantity", "INTEGER"),
    ), (("order_id", "orders", "order_id"), ("product_id", "products", "product_id"))),
)


def populate(rng: random.Random) -> dict[str, list[Row]]:
    customers = [
        (i, name, rng.choice(CITIES[:12])[0], maybe(rng, email_for(name, "shopper.net"), 0.2),
         iso_date(rng, "2019-01-01", "2024-03-31"), maybe(rng, rng.choice(TIERS), 0.4))
        for i, name in enumerate(person_names(rng, 80), 1)
    ]
    pool = [(f"{style} {noun}", cat) for cat, nouns in CATALOG.items() for noun in nouns for style in STYLES]
    products = [
        (i, name, cat, round(rng.choice(BASE_PRICES) + rng.choice((0, 0, 10, 30)), 2),
         rng.choice((0, 0, 3, 8, 12, 25, 40, 75, 120)))
        for i, (name, cat) in enumerate(rng.sample(pool, 60), 1)
    ]
    customer_ids = skewed_choices(rng, range(1, 81), 150)
    orders = [(i, customer_ids[i - 1], iso_date(rng, "2023-01-01", "2024-06-30"), rng.choice(STATUSES))
              for i in range(1, 151)]
    product_ids = skewed_choices(rng, range(1, 61), 200)
    order_ids = list(range(1, 151)) + [rng.randint(1, 150) for _ in range(50)]  # every order has an item
    items = [(i, order_ids[i - 1], product_ids[i - 1], rng.choice((1, 1, 1, 2, 2, 3, 5))) for i in range(1, 201)]
    return {"customers": customers, "products": products, "orders": orders, "order_items": items}


CUST_ORDER = "FROM customers AS T1 JOIN orders AS T2 ON T1.customer_id = T2.customer_id"
ITEM_PRODUCT = "FROM order_items AS T1 JOIN products AS T2 ON T1.product_id = T2.product_id"
CUST_ORDER_PRODUCT = (CUST_ORDER + " JOIN order_items AS T3 ON T2.order_id = T3.order_id "
                      "JOIN products AS T4 ON T3.product_id = T4.product_id")
CATEGORY = "SELECT DISTINCT category FROM products"

TEMPLATES = (
    # single table
    T("products_in_category", "SELECT name FROM products WHERE category = '{category}'",
      "Which products are in the '{category}' category?",
      "List the names of '{category}' products.",
      "What products does the store sell in '{category}'?", slots=CATEGORY),
    T("count_cheaper", "SELECT COUNT(*) FROM products WHERE price < {price}",
      "How many products cost less than {price}?",
      "Count the products priced under {price}.", slots="SELECT DISTINCT price FROM products"),
    T("customers_city", "SELECT name FROM customers WHERE city = '{city}'",
      "Which customers live in '{city}'?",
      "List the names of customers from '{city}'.", slots="SELECT DISTINCT city FROM customers"),
    T("count_status", "SELECT COUNT(*) FROM orders WHERE status = '{status}'",
      "How many orders are '{status}'?",
      "Count the orders whose status is '{status}'.", slots="SELECT DISTINCT status FROM orders"),
    T("out_of_stock", "SELECT name FROM products WHERE stock = 0",
      "Which products are out of stock?",
      "List the products with a stock of zero."),
    T("low_stock_category", "SELECT name FROM products WHERE category = '{category}' AND stock < {stock}",
      "Which '{category}' products have fewer than {stock} units in stock?",
      "List the '{category}' products whose stock is below {stock}.",
      slots="SELECT DISTINCT category, stock FROM products WHERE stock > 0"),
    T("avg_price_category", "SELECT AVG(price) FROM products WHERE category = '{category}'",
      "What is the average price of '{category}' products?",
      "Find the mean price in the '{category}' category.", slots=CATEGORY),
    T("signed_up_after", "SELECT name FROM customers WHERE signup_date > '{date}'",
      "Which customers signed up after '{date}'?",
      "List the customers whose signup date is later than '{date}'.",
      slots="SELECT signup_date AS date FROM customers WHERE signup_date > '2022-01-01'"),
    T("no_tier_count", "SELECT COUNT(*) FROM customers WHERE loyalty_tier IS NULL",
      "How many customers have no loyalty tier?",
      "Count the customers without a loyalty tier."),
    T("price_of_product", "SELECT price FROM products WHERE name = '{product}'",
      "How much does the '{product}' cost?",
      "What is the price of '{product}'?", slots="SELECT name AS product FROM products"),
    T("orders_on_date", "SELECT order_id FROM orders WHERE order_date = '{date}'",
      "Which orders were placed on '{date}'? Give their ids.",
      "List the ids of orders with the order date '{date}'.", slots="SELECT order_date AS date FROM orders"),
    T("tier_of_customer", "SELECT loyalty_tier FROM customers WHERE name = '{name}'",
      "What loyalty tier does '{name}' have?",
      "Find the loyalty tier of the customer '{name}'.",
      slots="SELECT name FROM customers WHERE loyalty_tier IS NOT NULL"),
    T("total_stock", "SELECT SUM(stock) FROM products WHERE category = '{category}'",
      "How many units of '{category}' products are in stock in total?",
      "What is the total stock of the '{category}' category?", slots=CATEGORY),
    # one join, GROUP BY or ORDER BY
    T("orders_of_customer", f"SELECT T2.order_id {CUST_ORDER} WHERE T1.name = '{{name}}'",
      "What are the ids of the orders placed by '{name}'?",
      "List the order ids of the customer '{name}'.", slots=f"SELECT DISTINCT T1.name AS name {CUST_ORDER}"),
    T("quantity_of_product", f"SELECT SUM(T1.quantity) {ITEM_PRODUCT} WHERE T2.name = '{{product}}'",
      "How many units of '{product}' have been ordered in total?",
      "What is the total quantity ordered of the product '{product}'?",
      slots=f"SELECT DISTINCT T2.name AS product {ITEM_PRODUCT}"),
    T("products_per_category", "SELECT category, COUNT(*) FROM products GROUP BY category",
      "How many products are in each category?",
      "Count the products per category."),
    T("orders_per_status", "SELECT status, COUNT(*) FROM orders GROUP BY status",
      "How many orders are there with each status?",
      "Show every order status with its number of orders."),
    T("priciest_in_category", "SELECT name FROM products WHERE category = '{category}' ORDER BY price DESC LIMIT 1",
      "What is the most expensive product in the '{category}' category?",
      "Which '{category}' product has the highest price?", slots=CATEGORY),
    T("cities_of_status", f"SELECT DISTINCT T1.city {CUST_ORDER} WHERE T2.status = '{{status}}'",
      "From which cities did customers place '{status}' orders?",
      "List the distinct cities of customers with an order whose status is '{status}'.",
      slots="SELECT DISTINCT status FROM orders"),
    T("units_per_category", f"SELECT T2.category, SUM(T1.quantity) {ITEM_PRODUCT} GROUP BY T2.category",
      "How many units were ordered in each product category?",
      "For each category, give the total quantity ordered."),
    T("latest_orders", "SELECT order_id, order_date FROM orders ORDER BY order_date DESC LIMIT 5",
      "What are the five most recent orders and their dates?",
      "Show the ids and dates of the 5 latest orders."),
    # nesting, set operations, HAVING, several joins
    T("never_ordered", "SELECT name FROM products WHERE product_id NOT IN (SELECT product_id FROM order_items)",
      "Which products have never been ordered?",
      "List the products that appear in no order."),
    T("customers_no_orders",
      "SELECT name FROM customers WHERE city = '{city}' AND customer_id NOT IN (SELECT customer_id FROM orders)",
      "Which customers from '{city}' have never placed an order?",
      "List the customers in '{city}' without any orders.", slots="SELECT DISTINCT city FROM customers"),
    T("best_seller", f"SELECT T2.name {ITEM_PRODUCT} GROUP BY T1.product_id ORDER BY SUM(T1.quantity) DESC LIMIT 1",
      "Which product has sold the most units?",
      "What is the best-selling product by total quantity?"),
    T("buyers_of_product", f"SELECT DISTINCT T1.name {CUST_ORDER_PRODUCT} WHERE T4.name = '{{product}}'",
      "Which customers have bought '{product}'?",
      "List the distinct names of customers who ordered the product '{product}'.",
      slots=f"SELECT DISTINCT T2.name AS product {ITEM_PRODUCT}"),
    T("both_categories",
      f"SELECT T1.name {CUST_ORDER_PRODUCT} WHERE T4.category = '{{cat1}}' INTERSECT "
      f"SELECT T1.name {CUST_ORDER_PRODUCT} WHERE T4.category = '{{cat2}}'",
      "Which customers bought products from both '{cat1}' and '{cat2}'?",
      "Find the customers who ordered products in the category '{cat1}' and also in the category '{cat2}'.",
      slots="SELECT A.category AS cat1, B.category AS cat2 FROM (SELECT DISTINCT category FROM products) AS A "
            "JOIN (SELECT DISTINCT category FROM products) AS B ON A.category < B.category"),
    T("categories_avg_price_having", "SELECT category FROM products GROUP BY category HAVING AVG(price) > {price}",
      "Which categories have an average product price above {price}?",
      "List the categories whose products cost more than {price} on average.",
      slots="SELECT DISTINCT CAST(AVG(price) AS INTEGER) - 1 AS price FROM products GROUP BY category"),
    T("pricier_than_avg", "SELECT name FROM products WHERE category = '{category}' AND price > (SELECT AVG(price) "
                          "FROM products)",
      "Which '{category}' products cost more than the average product?",
      "List the products in '{category}' priced above the overall average price.", slots=CATEGORY),
    T("top_customer", f"SELECT T1.name {CUST_ORDER} GROUP BY T1.customer_id ORDER BY COUNT(*) DESC LIMIT 1",
      "Which customer has placed the most orders?",
      "Who is the customer with the largest number of orders?"),
    T("categories_not_bought",
      f"SELECT DISTINCT category FROM products EXCEPT SELECT T4.category {CUST_ORDER_PRODUCT} WHERE T1.name = "
      f"'{{name}}'",
      "From which categories has '{name}' never bought anything?",
      "List the product categories in which '{name}' has no purchase.",
      slots=f"SELECT DISTINCT T1.name AS name {CUST_ORDER}"),
)

DOMAIN = Domain("retail_store", TABLES, populate, TEMPLATES)
